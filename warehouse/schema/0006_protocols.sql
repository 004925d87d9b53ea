-- Named evaluation protocols (judging/protocols.py). A judgment made under a named protocol
-- records the protocol's hash (NULL: judged without one); `webloop judge --protocol NAME`
-- re-judges what was judged under an earlier version of the protocol.
ALTER TABLE judgments ADD COLUMN protocol VARCHAR;

-- The side-by-side table of one run's trajectories under several protocols
-- (`webloop eval protocols RUN`): one row per protocol (other NULL: its own success rate on the
-- trajectories every listed protocol judged), per pair of protocols and per protocol against
-- the human labels (other 'human'), with the paired counts. Key: (comparison_id).
CREATE TABLE protocol_comparisons (
    comparison_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    protocol VARCHAR NOT NULL,
    protocol_hash VARCHAR NOT NULL,
    n BIGINT NOT NULL,
    successes BIGINT NOT NULL,
    other VARCHAR,
    model VARCHAR,
    rate DOUBLE,
    ci_low DOUBLE,
    ci_high DOUBLE,
    other_successes BIGINT,
    agree BIGINT,
    only_this BIGINT,
    only_other BIGINT,
    kappa DOUBLE,
    mcnemar_p DOUBLE,
    created_at TIMESTAMP WITH TIME ZONE
);
