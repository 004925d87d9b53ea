-- Lineage: snapshot -> dataset -> training run -> checkpoint (-> evaluations of it).
SELECT
    d.snapshot_id,
    d.dataset_id,
    d.name AS dataset,
    r.training_run_id,
    r.stage,
    r.base_model,
    r.status AS run_status,
    c.checkpoint_id,
    c.step AS checkpoint_step,
    (SELECT count(*) FROM evaluations AS e WHERE e.checkpoint_id = c.checkpoint_id)
        AS evaluations
FROM datasets AS d
LEFT JOIN training_runs AS r ON r.dataset_id = d.dataset_id
LEFT JOIN checkpoints AS c ON c.training_run_id = r.training_run_id
ORDER BY d.created_at, d.dataset_id, r.created_at, c.step
