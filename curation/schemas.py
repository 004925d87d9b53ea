"""The Arrow schemas of the exported examples: SFT rows, RL groups, preference pairs.

One schema per kind (:data:`KINDS`); the spool files, the Parquet files and the ``datasets``
features of an export all follow them (:mod:`curation.export`). Images are stored as the
``datasets`` ``Image()`` struct (PNG bytes, no path), so the bytes are the screenshot blob's.
"""

from __future__ import annotations

import pyarrow as pa

KINDS = ("sft", "rl", "preferences")

_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets' Image() storage
# A chat message as Hugging Face processors' chat templates and TRL read it: text parts and
# image placeholders (``{"type": "image"}``) whose images are the row's ``images``, in order.
_PART = pa.struct([("type", pa.string()), ("text", pa.string())])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.list_(_PART))])

SFT_SCHEMA = pa.schema(
    [
        ("example_id", pa.string()),
        ("kind", pa.string()),  # step | intervention
        ("traj_id", pa.string()),
        ("step_idx", pa.int64()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("policy", pa.string()),
        ("run_id", pa.string()),
        ("prompt", pa.string()),  # render(messages): canonical JSON, images as sha256: refs
        ("completion", pa.string()),  # the assistant reply (the target)
        ("images", pa.list_(_IMAGE)),  # the prompt's screenshots, in order
        ("image_hashes", pa.list_(pa.string())),
        ("prompt_hash", pa.string()),  # the stored prompt blob of this state (null: none stored)
        ("weight", pa.float64()),
        # the prompt and the target as chat messages (user/system turns, then the assistant's)
        ("messages", pa.list_(MESSAGE)),
    ]
)
RL_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("traj_id", pa.string()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("policy", pa.string()),
        ("run_id", pa.string()),
        ("instruction", pa.string()),
        ("status", pa.string()),
        ("n_steps", pa.int64()),
        ("actions", pa.list_(pa.string())),  # every stored step's action text, in order
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("weight", pa.float64()),
    ]
)
PREF_SCHEMA = pa.schema(
    [
        ("pair_id", pa.string()),
        ("source", pa.string()),  # outcome | prm
        ("task_id", pa.string()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("traj_id", pa.string()),  # the trajectory whose state is the prompt
        ("step_idx", pa.int64()),
        ("prompt", pa.string()),
        ("images", pa.list_(_IMAGE)),
        ("image_hashes", pa.list_(pa.string())),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("chosen_ref", pa.string()),  # outcome: traj_id; prm: "traj_id/step/cand"
        ("rejected_ref", pa.string()),
        ("scorer", pa.string()),
        ("chosen_score", pa.float64()),
        ("rejected_score", pa.float64()),
    ]
)
SCHEMAS = {"sft": SFT_SCHEMA, "rl": RL_SCHEMA, "preferences": PREF_SCHEMA}
