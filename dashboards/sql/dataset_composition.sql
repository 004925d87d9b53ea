-- Composition of one dataset ($dataset): member trajectories and steps per site, split and
-- policy (the member's split as stored in dataset_members).
WITH members AS (
    SELECT
        m.traj_id,
        m.step_idx,
        coalesce(m.split, '?') AS split
    FROM dataset_members AS m
    WHERE m.dataset_id = $dataset
)

SELECT
    coalesce(k.site, '?') AS site,
    m.split,
    coalesce(t.policy, '?') AS policy,
    count(DISTINCT m.traj_id) AS trajectories,
    count(m.step_idx) AS steps
FROM members AS m
LEFT JOIN trajectories AS t USING (traj_id)
LEFT JOIN tasks AS k ON k.task_id = t.task_id AND k.version = coalesce(t.task_version, 1)
GROUP BY ALL
ORDER BY 1, 2, 3
