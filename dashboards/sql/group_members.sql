-- All samples of one task group ($group) with their reward (dashboards.queries.group_members
-- adds the GRPO advantage, warehouse.advantage.group_relative over the rewarded samples).
-- Reward: 1 for success, 0 for failure; a 'finished' trajectory takes its verdict
-- (trajectory_verdicts: the newest decided verdict among its judges' latest judgments);
-- infrastructure errors, timeouts and running samples have no reward (NULL) and no advantage.
WITH members AS (
    SELECT
        t.traj_id,
        t.sample_idx,
        t.policy,
        t.status,
        t.n_steps,
        t.answer,
        t.meta,
        t.created_at
    FROM trajectories AS t
    WHERE t.group_id = $group
),

rewarded AS (
    SELECT
        m.*,
        CASE
            WHEN m.status = 'success' THEN 1.0::DOUBLE
            WHEN m.status = 'failure' THEN 0.0::DOUBLE
            WHEN m.status = 'finished' AND v.verdict = 'success' THEN 1.0::DOUBLE
            WHEN m.status = 'finished' AND v.verdict = 'failure' THEN 0.0::DOUBLE
        END AS reward
    FROM members AS m
    LEFT JOIN trajectory_verdicts AS v USING (traj_id)
),

last_step AS (
    SELECT s.traj_id, s.screenshot_hash, s.action_text
    FROM steps AS s
    WHERE s.traj_id IN (SELECT traj_id FROM members)
    QUALIFY row_number() OVER (PARTITION BY s.traj_id ORDER BY s.step_idx DESC) = 1
)

SELECT
    r.traj_id,
    r.sample_idx,
    r.policy,
    r.status,
    r.n_steps,
    r.answer,
    r.reward,
    coalesce(json_extract_string(r.meta, '$.final_screenshot'), l.screenshot_hash)
        AS final_screenshot,
    l.action_text AS last_action
FROM rewarded AS r
LEFT JOIN last_step AS l USING (traj_id)
ORDER BY r.reward DESC NULLS LAST, r.sample_idx, r.traj_id
