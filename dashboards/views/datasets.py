"""Datasets: recipes, composition charts, gate reports (in the data card), and lineage
(snapshot → dataset → training runs → checkpoints)."""

from __future__ import annotations

import json

import polars as pl
import streamlit as st

from dashboards import data, ui

st.title("Datasets")
ui.require_warehouse()

with ui.guarded("The datasets"):
    ds: pl.DataFrame = data.get("datasets")
    if ds.is_empty():
        ui.nothing_yet(
            "datasets", "Build one with `webloop curate --recipe curation/recipes/….yaml`."
        )
        st.stop()
    st.dataframe(
        ds.select("dataset_id", "name", "snapshot_id", "counts", "created_at"),
        hide_index=True,
        key="datasets",
    )
    rows = {r["dataset_id"]: r for r in ds.iter_rows(named=True)}
    did = st.selectbox(
        "Dataset", list(rows), format_func=lambda d: f"{rows[d]['name']} · {d}", key="ds_sel"
    )
    d = rows[did]
    counts = json.loads(d["counts"]) if d["counts"] else {}
    cols = st.columns(max(len(counts), 1))
    for col, (k, v) in zip(cols, counts.items(), strict=False):
        col.metric(k, v)
    comp: pl.DataFrame = data.get("dataset_composition", did)
    st.subheader("Composition")
    if comp.is_empty():
        st.caption("No members recorded for this dataset.")
    else:
        by = st.segmented_control("By", ["site", "split", "policy"], default="site", key="ds_by")
        by = by or "site"
        chart = comp.group_by(by).agg(pl.col("trajectories").sum(), pl.col("steps").sum())
        st.bar_chart(chart.sort(by).to_pandas().set_index(by))
        st.dataframe(comp, hide_index=True, key="composition")
    st.subheader("Recipe")
    st.code(
        json.dumps(json.loads(d["recipe"]), indent=2) if d["recipe"] else "(none)",
        language="json",
    )
    st.subheader("Data card and gate report")
    st.code(d["data_card"] or "(no data card)", language=None, wrap_lines=True)

with ui.guarded("Lineage"):
    st.subheader("Lineage")
    lin: pl.DataFrame = data.get("lineage")
    st.dataframe(lin, hide_index=True, key="lineage")
