-- Task groups (trajectories sharing a group_id), newest first: size, successes, task.
SELECT
    t.group_id,
    any_value(t.task_id) AS task_id,
    any_value(t.run_id) AS run_id,
    count(*) AS samples,
    count(*) FILTER (t.status = 'success') AS success,
    count(*) FILTER (t.status = 'failure') AS failure,
    max(t.created_at) AS last_at
FROM trajectories AS t
WHERE t.group_id IS NOT NULL AND ($run IS NULL OR t.run_id = $run)
GROUP BY t.group_id
ORDER BY last_at DESC, t.group_id
LIMIT coalesce($limit, 500)
