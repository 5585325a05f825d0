-- Ids are never reused: a forgotten memory's id is not given to a new memory (of any stream), so a trace or an
-- evidence pointer that named it shows "forgotten", never another memory. SQLite gives that with AUTOINCREMENT,
-- which only a rebuilt table can get (the migration runner turns foreign keys off around this and checks them
-- after). The sequence starts above every id in use.
CREATE TABLE memories_new (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    stream            TEXT    NOT NULL,
    kind              TEXT    NOT NULL CHECK (kind IN ('observation', 'reflection')),
    text              TEXT    NOT NULL,
    created_at        REAL    NOT NULL,            -- seconds since the epoch, UTC
    last_accessed_at  REAL    NOT NULL,
    importance        INTEGER CHECK (importance BETWEEN 1 AND 10),
    importance_source TEXT    CHECK (importance_source IN ('rater', 'fallback', 'derived', 'given')),
    depth             INTEGER NOT NULL DEFAULT 0,
    author            TEXT,
    author_id         TEXT,
    channel           TEXT,
    channel_id        TEXT,
    message_id        TEXT,
    status            TEXT    NOT NULL DEFAULT 'ready' CHECK (status IN ('pending', 'ready')),
    attempts          INTEGER NOT NULL DEFAULT 0,
    embedding         BLOB,                        -- float32, sqlite-vec's vector format
    next_attempt_at   REAL,
    CHECK (status = 'pending' OR (importance IS NOT NULL AND embedding IS NOT NULL))
);
INSERT INTO memories_new (id, stream, kind, text, created_at, last_accessed_at, importance, importance_source, depth,
                          author, author_id, channel, channel_id, message_id, status, attempts, embedding,
                          next_attempt_at)
    SELECT id, stream, kind, text, created_at, last_accessed_at, importance, importance_source, depth, author,
           author_id, channel, channel_id, message_id, status, attempts, embedding, next_attempt_at FROM memories;
DROP TABLE memories;
ALTER TABLE memories_new RENAME TO memories;
CREATE INDEX memories_by_stream ON memories (stream, created_at);
CREATE INDEX memories_pending ON memories (status) WHERE status = 'pending';
CREATE UNIQUE INDEX memories_by_message ON memories (stream, message_id) WHERE message_id IS NOT NULL;
CREATE INDEX memories_by_author ON memories (stream, author_id);

-- Reply traces too: /why of an old reply must never explain a newer one.
CREATE TABLE reply_traces_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    stream           TEXT NOT NULL,
    created_at       REAL NOT NULL,
    query            TEXT NOT NULL,
    reply_memory_id  INTEGER REFERENCES memories (id) ON DELETE SET NULL,
    message_id       TEXT,
    items            TEXT NOT NULL,                -- JSON: [{id, score, recency, importance, relevance}]
    query_message_id TEXT,
    query_author_id  TEXT,
    query_memory_id  INTEGER REFERENCES memories (id) ON DELETE CASCADE
);
INSERT INTO reply_traces_new (id, stream, created_at, query, reply_memory_id, message_id, items, query_message_id,
                              query_author_id, query_memory_id)
    SELECT id, stream, created_at, query, reply_memory_id, message_id, items, query_message_id, query_author_id,
           query_memory_id FROM reply_traces;
DROP TABLE reply_traces;
ALTER TABLE reply_traces_new RENAME TO reply_traces;
CREATE INDEX reply_traces_by_message ON reply_traces (message_id);
CREATE INDEX reply_traces_by_stream ON reply_traces (stream, created_at);
CREATE INDEX reply_traces_by_query_message ON reply_traces (query_message_id) WHERE query_message_id IS NOT NULL;
CREATE INDEX reply_traces_by_query_author ON reply_traces (stream, query_author_id) WHERE query_author_id IS NOT NULL;
CREATE INDEX reply_traces_by_query_memory ON reply_traces (query_memory_id) WHERE query_memory_id IS NOT NULL;
CREATE INDEX reply_traces_by_reply_memory ON reply_traces (reply_memory_id) WHERE reply_memory_id IS NOT NULL;
