-- Trajectories where a judge's latest verdict differs from a reference: the programmatic
-- judge's latest verdict or the latest human label (trajectory-level). A judge's verdict is its
-- latest judgment (latest_judgments) when that is a success or a failure.
WITH latest AS (
    SELECT traj_id, judge, judge_version, verdict, rationale
    FROM latest_judgments
    WHERE error IS NULL AND verdict IN ('success', 'failure')
),

refs AS (
    SELECT traj_id, 'programmatic' AS reference, verdict AS expected
    FROM latest WHERE judge = 'programmatic'
    UNION ALL
    SELECT traj_id, 'human' AS reference, label AS expected
    FROM latest_human_labels
    WHERE label IN ('success', 'failure')
)

SELECT
    l.traj_id,
    l.judge,
    l.judge_version,
    l.verdict,
    r.reference,
    r.expected,
    l.rationale
FROM latest AS l
INNER JOIN refs AS r USING (traj_id)
WHERE l.judge <> r.reference AND l.verdict <> r.expected
ORDER BY l.judge, r.reference, l.traj_id
LIMIT coalesce($limit, 500)
