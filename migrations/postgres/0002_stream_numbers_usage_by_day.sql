-- SQLite's 0006 and 0007. Privacy: the number a server sees for a memory is counted in its own stream (#1, #2, ...
-- per server), never reused within it (a purged stream starts again); the trigger numbers every new memory
-- (a copy brings its numbers along). And model calls per stream, role and UTC day (the dashboard's chart).
ALTER TABLE memories ADD COLUMN number integer;
UPDATE memories SET number = ranked.n
    FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY stream ORDER BY id) AS n FROM memories) AS ranked
    WHERE ranked.id = memories.id;
CREATE UNIQUE INDEX memories_by_number ON memories (stream, number);
CREATE TABLE stream_numbers (
    stream text PRIMARY KEY,
    last   integer NOT NULL
);
INSERT INTO stream_numbers (stream, last) SELECT stream, MAX(number) FROM memories GROUP BY stream;
CREATE FUNCTION memstream_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.number IS NULL THEN
        INSERT INTO stream_numbers AS s (stream, last) VALUES (NEW.stream, 1)
            ON CONFLICT (stream) DO UPDATE SET last = s.last + 1
            RETURNING last INTO NEW.number;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER memories_numbered BEFORE INSERT ON memories FOR EACH ROW EXECUTE FUNCTION memstream_number();

CREATE TABLE model_usage_daily (
    stream            text   NOT NULL,
    role              text   NOT NULL,
    day               bigint NOT NULL,           -- seconds since the epoch at 00:00 UTC of the day
    calls             bigint NOT NULL DEFAULT 0,
    failures          bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    retries           bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, role, day)
);
