-- The latest infrastructure errors and timeouts, with their error text.
SELECT
    t.traj_id,
    t.run_id,
    t.task_id,
    t.policy,
    t.status,
    t.error,
    t.created_at
FROM trajectories AS t
WHERE t.status IN ('infra_error', 'timeout')
ORDER BY t.created_at DESC, t.traj_id
LIMIT 200
