-- Success by suite, site, split and policy.
-- Outcome: the trajectory's own status (programmatic result) or, when $judge is given, that
-- judge's latest judgment (latest_judgments). Infrastructure errors never count as failures:
-- they are reported apart and left out of the rate's denominator, as are trajectories whose
-- latest judgment is a judge error or an abstention. Suite, site and split are those of the task
-- version the trajectory ran (trajectory_tasks).
WITH judged AS (
    SELECT traj_id, verdict
    FROM latest_judgments
    WHERE judge = $judge
),

outcomes AS (
    SELECT
        k.suite,
        k.site,
        k.split,
        t.policy,
        t.status,
        CASE
            WHEN t.status IN ('infra_error', 'timeout', 'running') THEN NULL
            WHEN $judge IS NULL AND t.status IN ('success', 'failure') THEN t.status
            WHEN $judge IS NOT NULL AND j.verdict IN ('success', 'failure') THEN j.verdict
        END AS outcome
    FROM trajectories AS t
    LEFT JOIN trajectory_tasks AS k USING (traj_id)
    LEFT JOIN judged AS j USING (traj_id)
)

SELECT
    suite,
    site,
    split,
    policy,
    count(*) AS trajectories,
    count(outcome) AS decided,
    count(*) FILTER (outcome = 'success') AS success,
    count(*) FILTER (status IN ('infra_error', 'timeout')) AS infra_or_timeout,
    round(count(*) FILTER (outcome = 'success') / nullif(count(outcome), 0), 4) AS success_rate
FROM outcomes
GROUP BY suite, site, split, policy
ORDER BY suite, site, split, policy
