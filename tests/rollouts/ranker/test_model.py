"""The scorer (:mod:`rollouts.ranker.model`): its checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest

from rollouts.ranker import RankerModel
from rollouts.ranker.encoding import encode_input
from rollouts.ranker.features import FEATURES
from rollouts.ranker.model import batch_tensors
from rollouts.ranker.prompt import parse_prompt
from tests.rollouts.ranker.fixture import HashEncoder, messages


def test_save_load_gives_identical_scores(tmp_path) -> None:
    model = RankerModel(seed=3).eval()
    enc = encode_input(parse_prompt(messages(["click(e24)"])), HashEncoder())
    before = model(*batch_tensors([enc])).detach()
    model.save_pretrained(tmp_path / "ck")
    import json

    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["model_type"] == "webloop-ranker" and cfg["features"] == list(FEATURES)
    assert "MiniLM" in cfg["encoder"] and cfg["feature_version"] >= 1
    again = RankerModel.from_pretrained(tmp_path / "ck")
    after = again(*batch_tensors([enc])).detach()
    assert before.shape == (len(enc.candidates),)
    assert np.array_equal(before.numpy(), after.numpy())
    other = RankerModel(seed=4).eval()(*batch_tensors([enc])).detach()
    assert not np.allclose(before.numpy(), other.numpy())  # the seed matters
    cfg["feature_version"] = 999
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="feature set version"):
        RankerModel.from_pretrained(tmp_path / "ck")
