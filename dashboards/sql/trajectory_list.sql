-- Trajectories for the review pages, filtered. Every parameter NULL = no filter.
-- $run, $task (substring of task_id), $site, $split, $statuses (list), $judge + $verdict (the
-- latest verdict of that judge, or of any judge when $judge is NULL; 'error' = a judge error),
-- $disagreement (TRUE: judges, the programmatic status or the latest human label disagree),
-- $label ('none' = no human label yet), $limit.
-- Verdicts: each judge's latest judgment (latest_judgments); site and split: the task version
-- the trajectory ran (trajectory_tasks).
WITH base AS (
    SELECT
        t.traj_id,
        t.run_id,
        t.task_id,
        t.policy,
        t.status,
        t.n_steps,
        t.group_id,
        t.created_at
    FROM trajectories AS t
    WHERE
        ($run IS NULL OR t.run_id = $run)
        AND ($task IS NULL OR contains(t.task_id, $task))
        AND ($statuses IS NULL OR list_contains($statuses, t.status))
    ORDER BY t.created_at DESC, t.traj_id
    -- without filters on judgments, labels or tasks, only the newest $limit need their
    -- verdicts and labels looked up (a page of 500 of 100k trajectories)
    LIMIT CASE
        WHEN
            $site IS NULL AND $split IS NULL AND $disagreement IS NULL AND $label IS NULL
            AND $verdict IS NULL
            THEN coalesce($limit, 500)
        ELSE 9223372036854775807
    END
),

latest_judgment AS (
    SELECT j.traj_id, j.judge, j.verdict, j.score, j.error
    FROM latest_judgments AS j
    WHERE j.traj_id IN (SELECT traj_id FROM base)
),

verdicts AS (
    SELECT
        traj_id,
        string_agg(judge || '=' || coalesce(verdict, 'error'), ', ' ORDER BY judge) AS verdicts,
        bool_or(verdict = 'success') AS any_success,
        bool_or(verdict = 'failure') AS any_failure,
        count(*) FILTER (error IS NOT NULL) AS judge_errors
    FROM latest_judgment
    GROUP BY traj_id
),

latest_label AS (
    SELECT traj_id, label, reviewer
    FROM latest_human_labels
    WHERE traj_id IN (SELECT traj_id FROM base)
),

joined AS (
    SELECT
        b.*,
        k.site,
        k.split,
        v.verdicts,
        coalesce(v.judge_errors, 0) AS judge_errors,
        l.label,
        l.reviewer,
        (
            (coalesce(v.any_success, false) AND coalesce(v.any_failure, false))
            OR (b.status = 'success' AND coalesce(v.any_failure, false))
            OR (b.status = 'failure' AND coalesce(v.any_success, false))
            OR (l.label = 'success' AND (coalesce(v.any_failure, false) OR b.status = 'failure'))
            OR (l.label = 'failure' AND (coalesce(v.any_success, false) OR b.status = 'success'))
        ) AS disagreement
    FROM base AS b
    LEFT JOIN trajectory_tasks AS k USING (traj_id)
    LEFT JOIN verdicts AS v USING (traj_id)
    LEFT JOIN latest_label AS l USING (traj_id)
)

SELECT
    traj_id,
    run_id,
    task_id,
    site,
    split,
    policy,
    status,
    n_steps,
    verdicts,
    judge_errors,
    disagreement,
    label,
    reviewer,
    group_id,
    created_at
FROM joined AS x
WHERE
    ($site IS NULL OR x.site = $site)
    AND ($split IS NULL OR x.split = $split)
    AND ($disagreement IS NULL OR x.disagreement = $disagreement)
    AND (
        $label IS NULL
        OR ($label = 'none' AND x.label IS NULL)
        OR x.label = $label
    )
    AND (
        $verdict IS NULL
        OR EXISTS (
            SELECT 1 FROM latest_judgment AS lj
            WHERE
                lj.traj_id = x.traj_id
                AND ($judge IS NULL OR lj.judge = $judge)
                AND coalesce(lj.verdict, 'error') = $verdict
        )
    )
ORDER BY x.created_at DESC, x.traj_id
LIMIT coalesce($limit, 500)
