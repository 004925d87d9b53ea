-- webloop warehouse schema, version 1: one table per entity of DESIGN.md's data model.
-- Columns mirror the record dataclasses in warehouse/records.py (tests/warehouse/test_schema.py
-- keeps both in step). JSON columns hold canonical JSON text. Keys are enforced by the writers
-- (DuckLake has no primary keys): see Warehouse.write.

-- A task: what to do, where to start, and how success is decided.  Key: (task_id, version).
CREATE TABLE tasks (
    task_id VARCHAR NOT NULL,
    suite VARCHAR NOT NULL,
    instruction VARCHAR NOT NULL,
    start_url VARCHAR NOT NULL,
    site VARCHAR,
    version BIGINT NOT NULL,
    suite_version VARCHAR,
    split VARCHAR,
    difficulty BIGINT,
    rubric JSON,
    reference JSON,
    checker JSON,
    source VARCHAR,
    meta JSON,
    content_hash VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- One execution of a stage (collect, judge, import, train, …) with its full config.  Key: (run_id).
CREATE TABLE runs (
    run_id VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    config JSON,
    name VARCHAR,
    code_version VARCHAR,
    status VARCHAR,
    error VARCHAR,
    started_at TIMESTAMP WITH TIME ZONE,
    ended_at TIMESTAMP WITH TIME ZONE,
    created_at TIMESTAMP WITH TIME ZONE
);

-- One attempt of a policy at a task; ``group_id`` ties the G samples of a task (GRPO).  Key: (traj_id).
CREATE TABLE trajectories (
    traj_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    task_id VARCHAR NOT NULL,
    policy VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    task_version BIGINT,
    group_id VARCHAR,
    sample_idx BIGINT,
    n_steps BIGINT,
    answer VARCHAR,
    error VARCHAR,
    started_at TIMESTAMP WITH TIME ZONE,
    ended_at TIMESTAMP WITH TIME ZONE,
    duration_s DOUBLE,
    meta JSON,
    created_at TIMESTAMP WITH TIME ZONE
);

-- One observation → action turn. Screenshots/trees/prompts are blob hashes, never inline.  Key: (traj_id, step_idx).
CREATE TABLE steps (
    traj_id VARCHAR NOT NULL,
    step_idx BIGINT NOT NULL,
    url VARCHAR,
    title VARCHAR,
    screenshot_hash VARCHAR,
    a11y_hash VARCHAR,
    prompt_hash VARCHAR,
    model_output VARCHAR,
    thought VARCHAR,
    action JSON,
    action_text VARCHAR,
    action_error VARCHAR,
    logprob DOUBLE,
    latency_model_s DOUBLE,
    latency_env_s DOUBLE,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A judge's verdict on a trajectory, or the judge's error (never a silent failure).  Key: (judgment_id).
CREATE TABLE judgments (
    judgment_id VARCHAR NOT NULL,
    traj_id VARCHAR NOT NULL,
    judge VARCHAR NOT NULL,
    judge_version VARCHAR NOT NULL,
    model VARCHAR,
    prompt_hash VARCHAR,
    verdict VARCHAR,
    score DOUBLE,
    criteria JSON,
    rationale VARCHAR,
    error VARCHAR,
    attempts BIGINT,
    run_id VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A candidate action sampled at a visited state (PRO-CUA).  Key: (traj_id, step_idx, cand_idx).
CREATE TABLE candidates (
    traj_id VARCHAR NOT NULL,
    step_idx BIGINT NOT NULL,
    cand_idx BIGINT NOT NULL,
    policy VARCHAR,
    model_output VARCHAR,
    action JSON,
    action_text VARCHAR,
    run_id VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A PRM score of one candidate, and its group-relative advantage within the state.  Key: (traj_id, step_idx, cand_idx, scorer, scorer_version).
CREATE TABLE step_scores (
    traj_id VARCHAR NOT NULL,
    step_idx BIGINT NOT NULL,
    cand_idx BIGINT NOT NULL,
    scorer VARCHAR NOT NULL,
    scorer_version VARCHAR NOT NULL,
    score DOUBLE,
    advantage DOUBLE,
    detail JSON,
    error VARCHAR,
    run_id VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A corrective step proposed for a failed trajectory, and whether replay verified it.  Key: (intervention_id).
CREATE TABLE interventions (
    intervention_id VARCHAR NOT NULL,
    traj_id VARCHAR NOT NULL,
    first_error_step BIGINT,
    proposed_action JSON,
    rationale VARCHAR,
    proposer VARCHAR,
    verified BOOLEAN,
    verified_outcome VARCHAR,
    replay_traj_id VARCHAR,
    run_id VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A person's label on a trajectory (or one step of it).  Key: (label_id).
CREATE TABLE human_labels (
    label_id VARCHAR NOT NULL,
    traj_id VARCHAR NOT NULL,
    label VARCHAR NOT NULL,
    reviewer VARCHAR NOT NULL,
    step_idx BIGINT,
    note VARCHAR,
    source VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A curated, versioned dataset pinned to a warehouse snapshot.  Key: (dataset_id).
CREATE TABLE datasets (
    dataset_id VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    snapshot_id BIGINT NOT NULL,
    recipe JSON,
    counts JSON,
    export_path VARCHAR,
    data_card VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- Membership of a trajectory (``step_idx`` null) or one step in a dataset.  Key: (dataset_id, traj_id, step_idx).
CREATE TABLE dataset_members (
    dataset_id VARCHAR NOT NULL,
    traj_id VARCHAR NOT NULL,
    step_idx BIGINT,
    split VARCHAR,
    weight DOUBLE
);

-- An SFT or RL training run: base model, dataset, full config.  Key: (training_run_id).
CREATE TABLE training_runs (
    training_run_id VARCHAR NOT NULL,
    stage VARCHAR NOT NULL,
    base_model VARCHAR NOT NULL,
    dataset_id VARCHAR,
    run_id VARCHAR,
    config JSON,
    code_version VARCHAR,
    status VARCHAR,
    started_at TIMESTAMP WITH TIME ZONE,
    ended_at TIMESTAMP WITH TIME ZONE,
    created_at TIMESTAMP WITH TIME ZONE
);

-- One scalar logged by a training run at a step.  Key: (training_run_id, step, name).
CREATE TABLE metrics (
    training_run_id VARCHAR NOT NULL,
    step BIGINT NOT NULL,
    name VARCHAR NOT NULL,
    value DOUBLE NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A saved model state of a training run.  Key: (checkpoint_id).
CREATE TABLE checkpoints (
    checkpoint_id VARCHAR NOT NULL,
    training_run_id VARCHAR NOT NULL,
    step BIGINT NOT NULL,
    path VARCHAR NOT NULL,
    sha256 VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- Success of a checkpoint (or policy) on a split, with a confidence interval.  Key: (evaluation_id).
CREATE TABLE evaluations (
    evaluation_id VARCHAR NOT NULL,
    suite VARCHAR NOT NULL,
    split VARCHAR NOT NULL,
    n BIGINT NOT NULL,
    n_success BIGINT NOT NULL,
    success_rate DOUBLE NOT NULL,
    checkpoint_id VARCHAR,
    policy VARCHAR,
    run_id VARCHAR,
    ci_low DOUBLE,
    ci_high DOUBLE,
    breakdown JSON,
    created_at TIMESTAMP WITH TIME ZONE
);

-- A pinned DuckLake snapshot: maintenance never expires it, so it stays readable.  Key: (pin_id).
CREATE TABLE pins (
    pin_id VARCHAR NOT NULL,
    snapshot_id BIGINT NOT NULL,
    reason VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);

-- Metadata of a blob in the content-addressed store (the bytes live in the store).  Key: (hash).
CREATE TABLE blobs (
    hash VARCHAR NOT NULL,
    size BIGINT NOT NULL,
    media_type VARCHAR,
    created_at TIMESTAMP WITH TIME ZONE
);
