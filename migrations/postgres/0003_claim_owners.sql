-- Who holds a pending memory's claim: the key of the claiming process's presence lock (memstream/store/postgres/
-- presence.py). A claim whose owner no longer holds its lock is free at once, not only once claimed_until passes.
ALTER TABLE memories ADD COLUMN claimed_by bigint;
