-- Success over time: per day and suite / split / site / policy, the programmatic outcome
-- (trajectory status). Infrastructure errors, timeouts and unfinished trajectories are counted
-- apart and left out of the rate's denominator. Suite, split and site: the task version the
-- trajectory ran (trajectory_tasks).
WITH outcomes AS (
    SELECT
        date_trunc('day', t.created_at) AS day,
        coalesce(k.suite, '?') AS suite,
        coalesce(k.split, '?') AS split,
        coalesce(k.site, '?') AS site,
        t.policy,
        t.status
    FROM trajectories AS t
    LEFT JOIN trajectory_tasks AS k USING (traj_id)
)

SELECT
    day,
    suite,
    split,
    site,
    policy,
    count(*) AS trajectories,
    count(*) FILTER (status = 'success') AS success,
    count(*) FILTER (status IN ('success', 'failure')) AS decided,
    count(*) FILTER (status IN ('infra_error', 'timeout')) AS infra_or_timeout,
    round(
        count(*) FILTER (status = 'success')
        / nullif(count(*) FILTER (status IN ('success', 'failure')), 0),
        4
    ) AS success_rate
FROM outcomes
GROUP BY ALL
ORDER BY day, suite, split, site, policy
