-- Privacy: which memories each reply was built from, one row per memory, so that deleting a memory finds at
-- once every reply whose prompt held it (and deletes it, its trace, and what cites it). Filled from the
-- traces already stored.
CREATE TABLE trace_items (
    memory_id INTEGER NOT NULL,
    trace_id  INTEGER NOT NULL REFERENCES reply_traces (id) ON DELETE CASCADE,
    PRIMARY KEY (memory_id, trace_id)
) WITHOUT ROWID;
CREATE INDEX trace_items_by_trace ON trace_items (trace_id);
INSERT OR IGNORE INTO trace_items (memory_id, trace_id)
    SELECT CAST(json_extract(item.value, '$.id') AS INTEGER), trace.id
    FROM reply_traces AS trace, json_each(trace.items) AS item
    WHERE json_valid(trace.items) AND json_extract(item.value, '$.id') IS NOT NULL;
