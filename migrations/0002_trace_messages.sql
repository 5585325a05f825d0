-- A reply longer than one Discord message is sent in parts: every part explains the same reply.
CREATE TABLE trace_messages (
    message_id TEXT PRIMARY KEY,
    trace_id   INTEGER NOT NULL REFERENCES reply_traces (id) ON DELETE CASCADE
);
CREATE INDEX trace_messages_by_trace ON trace_messages (trace_id);
