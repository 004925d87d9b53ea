-- Composition of one dataset ($dataset): its members per site, split and policy, as the dataset
-- stores them. site: the task version the member trajectory ran (trajectory_tasks); split: the
-- member's split in dataset_members (the task's split at build time, 'intervention' for the
-- state of a verified intervention); trajectories: distinct member trajectories; steps: step
-- members. '?' where a value is unknown (a trajectory or task no longer stored).
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
LEFT JOIN trajectory_tasks AS k USING (traj_id)
GROUP BY ALL
ORDER BY 1, 2, 3
