"""Training and evaluations: loss / reward / success curves per training run, checkpoints, and
success per checkpoint × split × site with confidence intervals."""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboards import data, ui

st.title("Training and evaluations")
ui.require_warehouse()

with ui.guarded("Training runs"):
    st.subheader("Training runs")
    runs: pl.DataFrame = data.get("training_runs")
    if runs.is_empty():
        ui.nothing_yet("training runs", "Train with `webloop train sft` or `webloop train rl`.")
    else:
        st.dataframe(runs, hide_index=True, key="training_runs")
        rid = st.selectbox("Run", runs.get_column("training_run_id").to_list(), key="tr_sel")
        m: pl.DataFrame = data.get("metrics", rid)
        if m.is_empty():
            st.caption("No metrics logged by this run yet.")
        else:
            names = sorted(m.get_column("name").unique().to_list())
            st.caption("Metrics: " + ", ".join(names))
            for name in names:
                curve = m.filter(pl.col("name") == name).select("step", "value")
                st.text(f"{name}: {curve.height} points, last {curve.get_column('value')[-1]:.4g}")
                st.line_chart(curve.to_pandas().set_index("step").rename(columns={"value": name}))
        cks: pl.DataFrame = data.get("checkpoints")
        st.subheader("Checkpoints")
        if cks.is_empty():
            st.caption("No checkpoints yet.")
        else:
            st.dataframe(cks, hide_index=True, key="checkpoints")

with ui.guarded("Evaluations"):
    st.subheader("Evaluations")
    ev: pl.DataFrame = data.get("evaluations")
    if ev.is_empty():
        ui.nothing_yet("evaluations", "Evaluate a checkpoint with `webloop eval`.")
    else:
        st.caption("Success rate with its Wilson interval per model, split and site.")
        st.dataframe(ev, hide_index=True, key="evaluations")
        overall = ev.filter(pl.col("site") == "all")
        table = overall.pivot(on="split", index="model", values="success_rate")
        st.dataframe(table, hide_index=True, key="eval_matrix")
