-- Model calls and tokens per stream, role and UTC day (the day of the call, by the wall clock), beside the
-- running totals of model_usage: what the dashboard's "over time" chart draws. Calls made before this
-- migration are only in the totals.
CREATE TABLE model_usage_daily (
    stream            TEXT    NOT NULL,
    role              TEXT    NOT NULL,
    day               INTEGER NOT NULL,           -- seconds since the epoch at 00:00 UTC of the day
    calls             INTEGER NOT NULL DEFAULT 0,
    failures          INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    retries           INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, role, day)
);
