-- Speed: a stream's memories take their ids in blocks of consecutive ids (memstream.store.idblocks), so that
-- its rows sit together in the file (SQLite keeps a table's rows in id order) and loading a stream reads
-- neighbouring pages rather than a page a row where many servers' messages arrive together. Ids stay global
-- and are never reused (a block is reserved in sqlite_sequence when it is opened); a server sees its own
-- numbers (0006). Rows written before this keep their ids.
CREATE TABLE id_blocks (
    stream TEXT PRIMARY KEY,
    next   INTEGER NOT NULL,  -- the stream's next id, in its current block
    stop   INTEGER NOT NULL   -- one past its current block's last id
);
