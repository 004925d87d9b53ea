-- Curation: teacher rationales (ERA), richer interventions (InT) and dataset provenance.

-- A teacher's reasoning for one step of a trajectory, stored apart from the trajectory and
-- included in training data only when a recipe asks for it.  Key: (traj_id, step_idx, teacher).
CREATE TABLE rationales (
    traj_id VARCHAR NOT NULL,
    step_idx BIGINT NOT NULL,
    teacher VARCHAR NOT NULL,
    thought VARCHAR NOT NULL,
    model VARCHAR,
    prompt_hash VARCHAR,
    run_id VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- Where the reference of an intervention came from ('task' or a successful traj_id), and the
-- teacher's and the verifier's details (error description, replayed steps, judge verdict).
ALTER TABLE interventions ADD COLUMN reference VARCHAR;
ALTER TABLE interventions ADD COLUMN detail JSON;

-- The recipe's content hash and the code that built a dataset (same recipe + snapshot → same bytes).
ALTER TABLE datasets ADD COLUMN recipe_hash VARCHAR;
ALTER TABLE datasets ADD COLUMN code_version VARCHAR;
