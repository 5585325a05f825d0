-- The memory stream: observations and reflections of every stream of one persona.
CREATE TABLE memories (
    id                INTEGER PRIMARY KEY,
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
    CHECK (status = 'pending' OR (importance IS NOT NULL AND embedding IS NOT NULL))
);
CREATE INDEX memories_by_stream ON memories (stream, created_at);
CREATE INDEX memories_pending ON memories (status) WHERE status = 'pending';
CREATE UNIQUE INDEX memories_by_message ON memories (stream, message_id) WHERE message_id IS NOT NULL;
CREATE INDEX memories_by_author ON memories (stream, author_id);

-- Evidence pointers: the memories each reflection cites, in citation order.
CREATE TABLE evidence (
    reflection_id INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    memory_id     INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    position      INTEGER NOT NULL,
    PRIMARY KEY (reflection_id, memory_id)
);
CREATE INDEX evidence_by_memory ON evidence (memory_id);

CREATE TABLE stream_state (
    stream                      TEXT PRIMARY KEY,
    importance_since_reflection INTEGER NOT NULL DEFAULT 0,
    last_reflection_at          REAL,
    reflections                 INTEGER NOT NULL DEFAULT 0,
    skipped_reflections         INTEGER NOT NULL DEFAULT 0
);

-- What each persona reply was built from, so that it can be explained later.
CREATE TABLE reply_traces (
    id              INTEGER PRIMARY KEY,
    stream          TEXT NOT NULL,
    created_at      REAL NOT NULL,
    query           TEXT NOT NULL,
    reply_memory_id INTEGER REFERENCES memories (id) ON DELETE SET NULL,
    message_id      TEXT,
    items           TEXT NOT NULL                  -- JSON: [{id, score, recency, importance, relevance}]
);
CREATE INDEX reply_traces_by_message ON reply_traces (message_id);
CREATE INDEX reply_traces_by_stream ON reply_traces (stream, created_at);

-- Model calls and tokens per stream and role (rater, reflector, agent, embedding).
CREATE TABLE model_usage (
    stream            TEXT    NOT NULL,
    role              TEXT    NOT NULL,
    calls             INTEGER NOT NULL DEFAULT 0,
    failures          INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, role)
);

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
