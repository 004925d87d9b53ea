-- Judge calibration results: agreement of a judge with a reference, per site (NULL = all).
-- Key: (agreement_id).
CREATE TABLE agreements (
    agreement_id VARCHAR NOT NULL,
    judge VARCHAR NOT NULL,
    reference VARCHAR NOT NULL,
    n BIGINT NOT NULL,
    judge_version VARCHAR,
    site VARCHAR,
    accuracy DOUBLE,
    "precision" DOUBLE,
    recall DOUBLE,
    f1 DOUBLE,
    kappa DOUBLE,
    judge_success_rate DOUBLE,
    reference_success_rate DOUBLE,
    success_rate_gap DOUBLE,
    created_at TIMESTAMP WITH TIME ZONE
);
