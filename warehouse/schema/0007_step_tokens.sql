-- The tokens a model sampled at a step (rollouts.policies.PolicyOutput.token_ids): the reply's
-- token ids as the engine chose them (no end-of-turn token), so RL scores exactly those tokens
-- instead of re-tokenising the reply's text; and where the image placeholder tokens sat in the
-- prompt the engine built ([start, length] runs of the image token id), so the trainer can tell
-- when its processor lays the prompt out differently. NULL: not recorded (scripted policies, a
-- server that does not name tokens by id, rows written before this version).
ALTER TABLE steps ADD COLUMN token_ids JSON;
ALTER TABLE steps ADD COLUMN image_spans JSON;
