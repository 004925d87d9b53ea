"""CLI commands of the curation stage: ``webloop curate``, ``webloop datasets list|show|diff``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import ConfigError, Format, FormatOption, _open, console, err, print_frame
from cli.options import config_command
from stages.curate import CurateConfig


def curate(cfg: CurateConfig) -> None:
    """Build, gate, export and register the dataset of a recipe (the curate flow)."""
    from flows.curate import curate as run_flow
    from stages.curate import check_recipe

    check_recipe(cfg)  # before the flow starts
    res = run_flow(cfg, on_progress=lambda line: console.print(line))
    counts = ", ".join(f"{k} {v}" for k, v in res.counts.items())
    console.print(
        f"dataset {res.name} {res.dataset_id} (snapshot {res.snapshot_id}): "
        f"{counts}\n  {res.export_path}",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add the curation commands to the ``webloop`` app."""
    datasets_app = typer.Typer(help="Versioned datasets: list, show, diff, push.")
    app.add_typer(datasets_app, name="datasets")

    config_command(app, "curate", CurateConfig, curate, help=curate.__doc__)

    @datasets_app.command("list")
    def datasets_list(fmt: FormatOption = Format.table) -> None:
        """Registered datasets, newest first."""
        from warehouse.listings import registered_datasets

        with _open(read_only=True) as wh:
            df = registered_datasets(wh)
        print_frame(df, fmt)

    @datasets_app.command("show")
    def datasets_show(
        ref: Annotated[str, typer.Argument(help="Dataset id or name (a name: its newest).")],
        fmt: FormatOption = Format.table,
    ) -> None:
        """One dataset: ids, snapshot, counts, members, export folder, recipe."""
        from warehouse.frames import rows_frame
        from warehouse.listings import dataset_member_counts

        with _open(read_only=True) as wh:
            row = _find(wh, ref, ConfigError)
            members = dataset_member_counts(wh, row["dataset_id"])
        fields = {
            "dataset_id": row["dataset_id"],
            "name": row["name"],
            "snapshot_id": row["snapshot_id"],
            "recipe_hash": row["recipe_hash"],
            "code_version": row["code_version"],
            "counts": row["counts"],
            "member trajectories": members["trajectories"],
            "member steps": members["steps"],
            "export_path": row["export_path"],
            "created_at": row["created_at"],
        }
        df = rows_frame([{"field": k, "value": str(v)} for k, v in fields.items()])
        print_frame(df, fmt, title=f"dataset {row['name']}")
        if fmt is Format.table and row["recipe"]:
            console.print(json.dumps(json.loads(row["recipe"]), indent=2), soft_wrap=True)

    @datasets_app.command("push")
    def datasets_push(
        ref: Annotated[str, typer.Argument(help="Dataset id or name (a name: its newest).")],
        repo: Annotated[str, typer.Option(help="Hub dataset repository, e.g. me/my-dataset.")],
        private: Annotated[
            bool,
            typer.Option(
                "--private/--public",
                help="Private (the default): a new repository is created private, an existing "
                "public one is made private before the upload (or nothing is pushed). --public: "
                "a new repository is created public; an existing one keeps its visibility.",
            ),
        ] = True,
    ) -> None:
        """Upload a dataset's export (data card, Parquet files, recipe) to the Hugging Face Hub;
        it then loads with datasets.load_dataset(REPO, "sft"). Private unless --public. The
        token is huggingface_hub's (HF_TOKEN, or hf auth login); HF_ENDPOINT names another
        Hub."""
        from curation.hub import PushError, push_folder

        with _open(read_only=True) as wh:
            row = _find(wh, ref, ConfigError)
        folder = Path(row["export_path"] or "")
        if not folder.is_dir():
            raise ConfigError(f"dataset {row['name']}: its export folder {folder} is gone")
        try:
            res = push_folder(folder, repo, private=private)
        except PushError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False)
            raise typer.Exit(1) from None
        console.print(
            f"pushed {row['name']} ({row['dataset_id']}): {len(res.files)} files to {repo} "
            f"({'private' if res.private else 'public'})\n"
            f"  {res.commit_url}",
            soft_wrap=True,
            markup=False,
        )

    @datasets_app.command("diff")
    def datasets_diff(
        a: Annotated[str, typer.Argument(help="Dataset id or name.")],
        b: Annotated[str, typer.Argument(help="Dataset id or name.")],
        fmt: FormatOption = Format.table,
    ) -> None:
        """Members added and removed from A to B, counts and recipe differences."""
        from warehouse.frames import rows_frame
        from warehouse.listings import dataset_member_diff

        with _open(read_only=True) as wh:
            ra, rb = _find(wh, a, ConfigError), _find(wh, b, ConfigError)
            diff = dataset_member_diff(wh, ra["dataset_id"], rb["dataset_id"])
        summary = member_summary(diff)
        rows = [
            {"what": f"{kind} {change}", "a": None, "b": None, "n": str(n)}
            for (change, kind), n in sorted(summary.items())
        ]
        ca, cb = _json(ra["counts"]), _json(rb["counts"])
        rows += [
            {"what": f"count {k}", "a": str(ca.get(k)), "b": str(cb.get(k)), "n": None}
            for k in sorted(set(ca) | set(cb))
            if ca.get(k) != cb.get(k)
        ]
        rows += [
            {"what": f"recipe {k}", "a": json.dumps(va), "b": json.dumps(vb), "n": None}
            for k, va, vb in recipe_diff(_json(ra["recipe"]), _json(rb["recipe"]))
        ]
        rows.append(
            {
                "what": "snapshot",
                "a": str(ra["snapshot_id"]),
                "b": str(rb["snapshot_id"]),
                "n": None,
            }
        )
        print_frame(rows_frame(rows, text=True), fmt, title=f"{a} → {b}")
        if fmt is Format.table and len(diff):
            print_frame(diff.head(50), fmt, title="members (first 50)")


def _json(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    return json.loads(value) if isinstance(value, str) else dict(value)


def _find(wh: Any, ref: str, error: type[Exception]) -> dict[str, Any]:
    """The dataset with id ``ref``, else the newest named ``ref``; ``error`` when neither."""
    from warehouse.listings import dataset_names, find_dataset

    row = find_dataset(wh, ref)
    if row is None:
        known = dataset_names(wh)
        raise error(
            f"no dataset with id or name {ref!r} (known names: {', '.join(known) or 'none'})"
        )
    return row


def member_summary(diff: Any) -> dict[tuple[str, str], int]:
    """(added|removed, trajectories|steps) → count, from a members diff frame."""
    out: dict[tuple[str, str], int] = {}
    for change, step in diff.select("change", "step_idx").iter_rows():
        key = (change, "trajectories" if step is None else "steps")
        out[key] = out.get(key, 0) + 1
    for change in ("added", "removed"):
        for kind in ("trajectories", "steps"):
            out.setdefault((change, kind), 0)
    return out


def recipe_diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[tuple]:
    """(dotted path, value in a, value in b) for every differing leaf of two recipes."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        path = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += recipe_diff(va, vb, path + ".")
        elif va != vb:
            out.append((path, va, vb))
    return out
