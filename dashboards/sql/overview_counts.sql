-- Overview: one row of counts (trajectories by status, steps, judgments, labels, backlog).
-- Judge backlog: ended trajectories (not running, not infra) without any judgment.
-- Label backlog: judged trajectories without a human label.
WITH judged AS (
    SELECT DISTINCT traj_id FROM judgments
),

labelled AS (
    SELECT DISTINCT traj_id FROM human_labels
)

SELECT
    (SELECT count(*) FROM tasks) AS tasks,
    (SELECT count(*) FROM runs) AS runs,
    count(*) AS trajectories,
    count(*) FILTER (t.status = 'success') AS success,
    count(*) FILTER (t.status = 'failure') AS failure,
    count(*) FILTER (t.status = 'finished') AS finished_unjudged_status,
    count(*) FILTER (t.status = 'running') AS running,
    count(*) FILTER (t.status = 'infra_error') AS infra_error,
    count(*) FILTER (t.status = 'timeout') AS timeout,
    (SELECT count(*) FROM steps) AS steps,
    (SELECT count(*) FROM judgments) AS judgments,
    (SELECT count(*) FROM judgments WHERE error IS NOT NULL) AS judge_errors,
    (SELECT count(*) FROM human_labels) AS human_labels,
    count(*) FILTER (
        t.status NOT IN ('running', 'infra_error') AND j.traj_id IS NULL
    ) AS judge_backlog,
    count(*) FILTER (j.traj_id IS NOT NULL AND l.traj_id IS NULL) AS label_backlog
FROM trajectories AS t
LEFT JOIN judged AS j USING (traj_id)
LEFT JOIN labelled AS l USING (traj_id)
