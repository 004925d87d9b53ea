-- Which judge decided an evaluation's outcomes: NULL for the rollouts' own grading (the bundled
-- checkers at episode end, a trajectory's stored status), else the judge's name
-- (`webloop eval --judge rubric_vlm …`). Deltas compare evaluations of one judge only.
ALTER TABLE evaluations ADD COLUMN judge VARCHAR;
