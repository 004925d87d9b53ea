-- Members of dataset $new that dataset $old lacks ('added') and members of $old that $new lacks
-- ('removed'). One row per member: change, traj_id, step_idx (null: the whole trajectory is a
-- member; a number: that one step). Sorted by change, traj_id, then step (whole trajectory
-- first). No rows when the two hold the same members (or neither exists).
WITH old_members AS (
    SELECT
        traj_id,
        step_idx
    FROM dataset_members
    WHERE dataset_id = $old
),

new_members AS (
    SELECT
        traj_id,
        step_idx
    FROM dataset_members
    WHERE dataset_id = $new
)

SELECT
    'added' AS change,
    *
FROM (SELECT * FROM new_members EXCEPT SELECT * FROM old_members)
UNION ALL
SELECT
    'removed' AS change,
    *
FROM (SELECT * FROM old_members EXCEPT SELECT * FROM new_members)
ORDER BY change, traj_id, step_idx NULLS FIRST
