"""Export: HF datasets folders + Parquet + data card, byte-identical across builds of the same
recipe and snapshot (also after the warehouse gained rows), loadable with ``datasets``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from curation.build import build_dataset
from curation.examples import sft_messages
from rollouts.prompts import render
from tests.curation.test_examples import engine_warehouse, recipe
from warehouse import Warehouse
from warehouse.records import Trajectory

FILTERS = "[{drop_invalid_steps: {noop: false}}]"  # (the simulated pages never change)


def file_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """One warehouse, two builds at snapshot N, a later write, a third build pinned to N."""
    from warehouse import WarehouseConfig

    base = tmp_path_factory.mktemp("export")
    cfg = WarehouseConfig.from_env(home=base / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        engine_warehouse(wh)
        r = recipe(filters=FILTERS)
        first = build_dataset(wh, r, out_dir=base / "a", blobs=wh.blobs, progress=None)
        n = first.snapshot_id  # (the first build's pin and registration made new snapshots)
        second = build_dataset(
            wh, r, out_dir=base / "b", snapshot_id=n, blobs=wh.blobs, progress=None
        )
        # the warehouse gains a trajectory after the pinned snapshot
        wh.write(
            [
                Trajectory(
                    traj_id="late",
                    run_id="run-engine",
                    task_id="shop-kettle",
                    policy="openai",
                    status="success",
                    n_steps=0,
                )
            ]
        )
        pinned = build_dataset(
            wh, r, out_dir=base / "c", snapshot_id=n, blobs=wh.blobs, progress=None
        )
        latest = build_dataset(wh, r, out_dir=base / "d", blobs=wh.blobs, progress=None)
        prompts = {
            h: wh.blobs.get(h)
            for h in wh.sql("SELECT prompt_hash FROM steps")["prompt_hash"].to_list()
        }
    return dict(
        first=first, second=second, pinned=pinned, latest=latest, base=base, prompts=prompts
    )


def test_same_recipe_and_snapshot_give_byte_identical_files(built):
    first, second, pinned = built["first"], built["second"], built["pinned"]
    assert first.dataset_id == second.dataset_id == pinned.dataset_id
    a = file_hashes(Path(first.export_path))
    assert set(a) >= {
        "README.md",
        "recipe.json",
        "metadata.json",
        "sft/dataset_info.json",
        "sft/state.json",
        "sft/data-00000-of-00001.arrow",
        "parquet/sft.parquet",
        "rl/data-00000-of-00001.arrow",
        "parquet/preferences.parquet",
    }
    assert a == file_hashes(Path(second.export_path))
    assert a == file_hashes(Path(pinned.export_path))  # built after the warehouse grew


def test_a_later_snapshot_is_another_dataset(built):
    first, latest = built["first"], built["latest"]
    assert latest.snapshot_id > first.snapshot_id
    assert latest.dataset_id != first.dataset_id
    assert latest.counts["trajectories"] == first.counts["trajectories"] + 1
    assert latest.counts["rl"] == first.counts["rl"] + 1  # the late success joins its group


def test_export_loads_with_datasets_and_images_decode(built):
    path = Path(built["first"].export_path)
    sft = datasets.load_from_disk(str(path / "sft"))
    # kettle 2 x 3 steps + oslo 3 steps minus its invalid one = 8
    assert len(sft) == 8
    assert isinstance(sft.features["images"].feature, datasets.Image)
    first_image = sft[0]["images"][0]
    assert first_image.size == (160, 100) and first_image.mode == "RGB"
    raw = sft.cast_column("images", datasets.List(datasets.Image(decode=False)))
    for row in raw:  # re-rendered from the export: the exact stored prompt bytes
        assert render(sft_messages(row)[:-1]).encode() == built["prompts"][row["prompt_hash"]]
    table = pq.read_table(path / "parquet" / "sft.parquet")
    assert table.num_rows == 8 and b"huggingface" in table.schema.metadata
    rl = datasets.load_from_disk(str(path / "rl"))
    assert sorted(rl["reward"]) == [0.0, 1.0, 1.0]


def test_data_card_names_composition_filters_licence_and_provenance(built):
    first = built["first"]
    card = (Path(first.export_path) / "README.md").read_text()
    assert first.data_card == card
    assert f"- warehouse snapshot (pinned): {first.snapshot_id}" in card
    assert f"- recipe sha256: `{first.recipe_hash}`" in card
    assert "| shop | train | openai | 2 | 6 |" in card  # site, split, policy, trajs, steps
    assert "| travel | train | openai | 1 | 2 |" in card
    assert '| drop_invalid_steps | {"noop": false} | 0 | 1 |' in card  # the oslo step
    assert "Apache-2.0" in card and "| bundled |" in card
    assert "sft: 8" in card


def _load(path: Path, tmp: Path, config: str | None = None) -> datasets.Dataset:
    """``load_dataset(path, config, split="train")`` with a cache of the test's own: the
    ``datasets`` cache is keyed by the folder's name (a dataset id, equal across code versions),
    and ``HF_DATASETS_CACHE`` is read once, at import, so setting it in a test does nothing."""
    return datasets.load_dataset(str(path), config, split="train", cache_dir=str(tmp / "hf"))


def _rows(ds: datasets.Dataset) -> list[dict]:
    raw = ds.cast_column("images", datasets.List(datasets.Image(decode=False)))
    return [{**r, "images": [i["bytes"] for i in r["images"]]} for r in raw]


def test_the_folder_loads_as_a_hub_dataset_repository_with_the_same_rows(
    built, tmp_path, monkeypatch
):
    """``load_dataset(folder, "sft")`` reads the data card's configs, as for a Hub repository;
    the rows equal ``load_from_disk``'s. The files a push uploads, alone in a folder (the repo's
    layout), load the same."""
    from curation.export import hub_files

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = Path(built["first"].export_path)
    from_disk = _rows(datasets.load_from_disk(str(path / "sft")))
    loaded = _load(path, tmp_path, "sft")
    assert _rows(loaded) == from_disk and len(from_disk) == 8
    default = _load(path, tmp_path)  # sft is the default config
    assert default["example_id"] == loaded["example_id"]
    rl = _load(path, tmp_path, "rl")
    assert sorted(rl["reward"]) == [0.0, 1.0, 1.0]

    files = hub_files(path)
    assert [str(f) for f in files] == [
        "README.md", "metadata.json", "parquet/preferences.parquet", "parquet/rl.parquet",
        "parquet/sft.parquet", "recipe.json",
    ]  # fmt: skip
    repo = tmp_path / "repo"
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_bytes((path / f).read_bytes())
    assert _rows(_load(repo, tmp_path, "sft")) == from_disk


def test_sft_messages_render_with_a_processor_chat_template(built, tiny):
    """The ``messages`` column renders with a Hugging Face processor's chat template (the real
    Qwen2.5-VL template from TRL): one image placeholder per screenshot, in the order of
    ``images``, the prompt's text and the target; the processor takes the row's images."""
    from trl.chat_template_utils import qwen2_5_vl_chat_template

    from rollouts.hf import image_only_processor_class

    processor = image_only_processor_class().from_pretrained(str(tiny))
    processor.chat_template = qwen2_5_vl_chat_template
    sft = datasets.load_from_disk(str(Path(built["first"].export_path) / "sft"))
    row = next(r for r in sft if len(r["images"]) >= 2)
    roles = [m["role"] for m in row["messages"]]
    assert roles[-1] == "assistant" and "user" in roles
    assert row["messages"][-1]["content"] == [{"type": "text", "text": row["completion"]}]
    text = processor.apply_chat_template(row["messages"], tokenize=False)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == len(row["images"])
    assert row["completion"] in text and text.index("<|im_start|>assistant") > text.index(
        "<|vision_start|>"
    )
    task_line = next(
        p["text"] for m in row["messages"] if m["role"] == "user" for p in m["content"]
        if p["type"] == "text"
    )  # fmt: skip
    assert task_line[:40] in text
    batch = processor(text=[text], images=row["images"], return_tensors="pt")
    n_pad = int(
        (batch["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()
    )
    assert batch["pixel_values"].shape[0] > 0 and n_pad == int(
        (batch["image_grid_thw"].prod(-1) // 4).sum()
    )


def test_a_push_uploads_the_files_that_load_as_the_folder_does(built, tmp_path, monkeypatch):
    """``push_folder`` through huggingface_hub's own client, to a local stand-in of the Hub's
    upload endpoints (the Hub cannot be reached here): the files committed are the Hub files,
    the user's token went with the requests, and the repository they make loads the same rows."""
    from curation.hub import PushError, push_folder
    from tests.curation.hub_stand_in import HubStandIn

    path = Path(built["first"].export_path)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_123")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with HubStandIn(tmp_path / "hub", "hf_secret_token_123") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        res = push_folder(path, "me/webloop-sft")
        assert any(r.endswith("/commit/main") for r in hub.requests)
        monkeypatch.setenv("HF_TOKEN", "wrong")
        with pytest.raises(PushError, match="the Hub refused the push to me/other"):
            push_folder(path, "me/other")
    repo = tmp_path / "hub" / "me" / "webloop-sft"
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()) == list(
        res.files
    )
    assert "/datasets/me/webloop-sft/commit/" in res.commit_url
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = _load(repo, tmp_path, "sft")
    assert _rows(loaded) == _rows(datasets.load_from_disk(str(path / "sft")))
    with pytest.raises(PushError, match="offline mode"):
        push_folder(path, "me/webloop-sft")


def test_a_push_is_private_unless_public_is_asked_and_makes_a_public_repo_private(
    built, tmp_path, monkeypatch
):
    """Through huggingface_hub's own client to the stand-in, which keeps each repository's
    visibility: a new repository is created private by default and public only when asked; an
    existing public one is made private (the Hub's settings call) before the upload, and where
    the Hub refuses that, nothing is uploaded; ``private=False`` leaves an existing private
    repository private."""
    from curation.hub import PushError, push_folder
    from tests.curation.hub_stand_in import HubStandIn

    path = Path(built["first"].export_path)
    monkeypatch.setenv("HF_TOKEN", "hf_tok")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    existing = {"me/was-public": False, "me/was-private": True}
    with HubStandIn(tmp_path / "hub", "hf_tok", repos=existing) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        results = {
            "me/new": push_folder(path, "me/new"),
            "me/new-public": push_folder(path, "me/new-public", private=False),
            "me/was-public": push_folder(path, "me/was-public"),
            "me/was-private": push_folder(path, "me/was-private", private=False),
        }
        visibility = dict(hub.repos)
        settings_calls = [r for r in hub.requests if r.endswith("/settings")]
    assert visibility == {
        "me/new": True,
        "me/new-public": False,
        "me/was-public": True,
        "me/was-private": True,
    }
    assert {repo: res.private for repo, res in results.items()} == visibility
    assert settings_calls == ["/api/datasets/me/was-public/settings"]  # only where needed
    for repo in results:
        assert (tmp_path / "hub" / repo / "parquet").is_dir()

    with HubStandIn(
        tmp_path / "hub2", "hf_tok", repos={"me/open": False}, refuse_settings=True
    ) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(PushError) as refused:
            push_folder(path, "me/open")
        assert hub.repos == {"me/open": False}
        assert not any("/commit/" in r for r in hub.requests)
    assert str(refused.value).startswith(
        "me/open is public and the Hub did not make it private (403 "
    )
    assert str(refused.value).endswith(
        "nothing was pushed; make it private on the Hub, or pass --public to publish to it"
    )
    assert not (tmp_path / "hub2" / "me" / "open").exists()
