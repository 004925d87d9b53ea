-- The labelling queue: ended trajectories without a human label, disagreements first, then
-- low-confidence verdicts (an abstention, a judge error, a score within 0.25 of 0.5), then the
-- rest, oldest first within a tier. Infrastructure errors and running trajectories are left out.
-- Verdicts: each judge's latest judgment (latest_judgments).
-- $random: a uniformly random order instead (a seeded hash of the trajectory id, $seed): the
-- labels of a random sample debias a judge's success rate (prediction-powered inference).
WITH unlabelled AS (
    SELECT t.traj_id, t.run_id, t.task_id, t.policy, t.status, t.n_steps, t.created_at
    FROM trajectories AS t
    WHERE
        t.status NOT IN ('running', 'infra_error')
        AND NOT EXISTS (SELECT 1 FROM human_labels AS h WHERE h.traj_id = t.traj_id)
),

latest_judgment AS (
    SELECT j.traj_id, j.judge, j.verdict, j.score, j.error
    FROM latest_judgments AS j
    WHERE j.traj_id IN (SELECT traj_id FROM unlabelled)
),

verdicts AS (
    SELECT
        traj_id,
        string_agg(judge || '=' || coalesce(verdict, 'error'), ', ' ORDER BY judge) AS verdicts,
        bool_or(verdict = 'success') AS any_success,
        bool_or(verdict = 'failure') AS any_failure,
        bool_or(
            error IS NOT NULL OR verdict = 'abstain' OR abs(score - 0.5) < 0.25
        ) AS low_confidence
    FROM latest_judgment
    GROUP BY traj_id
)

SELECT
    u.traj_id,
    u.run_id,
    u.task_id,
    u.policy,
    u.status,
    u.n_steps,
    v.verdicts,
    CASE
        WHEN
            (coalesce(v.any_success, false) AND coalesce(v.any_failure, false))
            OR (u.status = 'success' AND coalesce(v.any_failure, false))
            OR (u.status = 'failure' AND coalesce(v.any_success, false))
            THEN 'disagreement'
        WHEN coalesce(v.low_confidence, false) THEN 'low confidence'
        WHEN v.traj_id IS NULL THEN 'unjudged'
        ELSE 'agreed'
    END AS reason,
    CASE reason
        WHEN 'disagreement' THEN 0 WHEN 'low confidence' THEN 1 WHEN 'unjudged' THEN 2 ELSE 3
    END AS priority
FROM unlabelled AS u
LEFT JOIN verdicts AS v USING (traj_id)
ORDER BY
    CASE WHEN coalesce($random, false) THEN hash(u.traj_id || '/' || coalesce($seed, 0)) END,
    priority,
    u.created_at,
    u.traj_id
LIMIT coalesce($limit, 200)
