-- A stream's reflections, found without a look at each of its memories: a stream's load reads their evidence
-- pointers (evidence_links), which looked up every memory of the stream for its kind to find its few reflections
-- (at 10M memories in 1,000 interleaved streams, 30-45 ms of a 10k-memory stream's load, beside its rows' read).
CREATE INDEX IF NOT EXISTS memories_reflections ON memories (stream) WHERE kind = 'reflection';
