-- Privacy: the number a server sees for a memory is counted in its own stream (#1, #2, ... per server), so it
-- tells nothing about how busy the persona is elsewhere. Numbers are never reused within a stream; the ids
-- (global, never reused either) stay what the operator's tools show.
ALTER TABLE memories ADD COLUMN number INTEGER;
UPDATE memories SET number = ranked.n
    FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY stream ORDER BY id) AS n FROM memories) AS ranked
    WHERE ranked.id = memories.id;
CREATE UNIQUE INDEX memories_by_number ON memories (stream, number);
CREATE TABLE stream_numbers (
    stream TEXT PRIMARY KEY,
    last   INTEGER NOT NULL
);
INSERT INTO stream_numbers (stream, last) SELECT stream, MAX(number) FROM memories GROUP BY stream;
CREATE TRIGGER memories_numbered AFTER INSERT ON memories WHEN NEW.number IS NULL
BEGIN
    INSERT INTO stream_numbers (stream, last) VALUES (NEW.stream, 1)
        ON CONFLICT (stream) DO UPDATE SET last = last + 1;
    UPDATE memories SET number = (SELECT last FROM stream_numbers WHERE stream = NEW.stream) WHERE id = NEW.id;
END;
