-- Durability: a pending observation whose model calls failed is retried with backoff (memstream.store.retry_delay);
-- this is when its next attempt is due (NULL: at once).
ALTER TABLE memories ADD COLUMN next_attempt_at REAL;

-- Privacy: which message (and whose) a reply answered. A trace's query is that message's text, so forgetting
-- the message, or everything its author said, forgets the trace and the reply built for it.
ALTER TABLE reply_traces ADD COLUMN query_message_id TEXT;
ALTER TABLE reply_traces ADD COLUMN query_author_id TEXT;
ALTER TABLE reply_traces ADD COLUMN query_memory_id INTEGER REFERENCES memories (id) ON DELETE CASCADE;
CREATE INDEX reply_traces_by_query_message ON reply_traces (query_message_id) WHERE query_message_id IS NOT NULL;
CREATE INDEX reply_traces_by_query_author ON reply_traces (stream, query_author_id) WHERE query_author_id IS NOT NULL;
CREATE INDEX reply_traces_by_query_memory ON reply_traces (query_memory_id) WHERE query_memory_id IS NOT NULL;
CREATE INDEX reply_traces_by_reply_memory ON reply_traces (reply_memory_id) WHERE reply_memory_id IS NOT NULL;

-- Faults: how often each degraded outcome happened, per stream and kind (rating_fallback, insight_dropped,
-- questions_trimmed, observation_deferred); shown by `memstream stats` and /memory-stats.
CREATE TABLE faults (
    stream TEXT    NOT NULL,
    kind   TEXT    NOT NULL,
    count  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, kind)
);

-- Model calls that succeeded only after the client retried them (HTTP 429/5xx, timeouts, lost connections).
ALTER TABLE model_usage ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
