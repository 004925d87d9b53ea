-- Success by suite, site, split and policy.
-- Outcome: the trajectory's own status (programmatic result) or, when $judge is given, that
-- judge's latest verdict. Infrastructure errors never count as failures: they are reported
-- apart and left out of the rate's denominator, as are judge errors and abstentions.
WITH latest_judgment AS (
    SELECT traj_id, verdict
    FROM judgments
    WHERE judge = $judge AND error IS NULL
    QUALIFY row_number() OVER (PARTITION BY traj_id ORDER BY created_at DESC) = 1
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
    LEFT JOIN tasks AS k
        ON k.task_id = t.task_id AND k.version = coalesce(t.task_version, 1)
    LEFT JOIN latest_judgment AS j USING (traj_id)
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
