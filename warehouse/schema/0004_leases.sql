-- Run leases: which process may write a run (one collector per run).
--
-- DuckLake has no row locks and no unique constraints, so a lease is taken by inserting a claim
-- and reading the claims back: the holder is the OLDEST live claim, where "oldest" is the commit
-- order (the DuckLake snapshot that inserted the claim row, the `snapshot_id` virtual column).
-- Claims are never updated (an update would move the row to a newer snapshot); heartbeats and
-- releases go to `run_lease_beats`, one row per claim, rewritten in place.
CREATE TABLE run_leases (
    run_id VARCHAR NOT NULL,
    claim_id VARCHAR NOT NULL,
    holder VARCHAR,           -- what holds it (e.g. 'collect')
    host VARCHAR NOT NULL,
    pid BIGINT NOT NULL,
    ttl_s DOUBLE NOT NULL,    -- a claim without a heartbeat for this long is expired
    claimed_at TIMESTAMP WITH TIME ZONE NOT NULL
);

CREATE TABLE run_lease_beats (
    claim_id VARCHAR NOT NULL,
    beat_at TIMESTAMP WITH TIME ZONE NOT NULL,
    released_at TIMESTAMP WITH TIME ZONE
);
