-- Trajectory summary per run and policy: volume, outcomes, lengths and durations.
-- Success rate excludes infrastructure errors and unfinished trajectories from the denominator.
WITH step_counts AS (
    SELECT traj_id, count(*) AS n_step_rows, count(action_error) AS n_invalid
    FROM steps
    GROUP BY traj_id
),

trajs AS (
    SELECT
        t.run_id,
        t.policy,
        t.status,
        t.duration_s,
        coalesce(s.n_step_rows, 0) AS n_step_rows,
        coalesce(s.n_invalid, 0) AS n_invalid
    FROM trajectories AS t
    LEFT JOIN step_counts AS s USING (traj_id)
)

SELECT
    run_id,
    policy,
    count(*) AS trajectories,
    sum(n_step_rows)::BIGINT AS steps,
    count(*) FILTER (status = 'success') AS success,
    count(*) FILTER (status = 'failure') AS failure,
    count(*) FILTER (status = 'finished') AS unjudged,
    count(*) FILTER (status IN ('infra_error', 'timeout')) AS infra_or_timeout,
    count(*) FILTER (status = 'running') AS running,
    round(
        count(*) FILTER (status = 'success')
        / nullif(count(*) FILTER (status IN ('success', 'failure')), 0),
        4
    ) AS success_rate,
    round(avg(n_step_rows), 2) AS mean_steps,
    sum(n_invalid)::BIGINT AS invalid_actions,
    round(avg(duration_s), 2) AS mean_duration_s
FROM trajs
GROUP BY run_id, policy
ORDER BY run_id, policy
