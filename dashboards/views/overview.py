"""Overview: counts, success over time by suite / split / site / policy, judge and label
backlogs, infrastructure errors."""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboards import data, ui

st.title("Overview")
ui.require_warehouse()

with ui.guarded("The counts"):
    c = data.get("overview_counts")
    if c["trajectories"] == 0:
        ui.nothing_yet(
            "trajectories",
            "Collect some with `webloop collect` (or `webloop demo`); "
            f"the warehouse holds {c['tasks']} task(s) and {c['runs']} run(s).",
        )
    cols = st.columns(6)
    cols[0].metric("Trajectories", f"{c['trajectories']:,}")
    cols[1].metric("Success", f"{c['success']:,}")
    cols[2].metric("Failure", f"{c['failure']:,}")
    cols[3].metric("Running", f"{c['running']:,}")
    cols[4].metric("Infra errors", f"{c['infra_error']:,}")
    cols[5].metric("Timeouts", f"{c['timeout']:,}")
    cols = st.columns(6)
    cols[0].metric("Steps", f"{c['steps']:,}")
    cols[1].metric("Judgments", f"{c['judgments']:,}")
    cols[2].metric("Judge errors", f"{c['judge_errors']:,}")
    cols[3].metric("Judge backlog", f"{c['judge_backlog']:,}", help="ended, not judged yet")
    cols[4].metric("Label backlog", f"{c['label_backlog']:,}", help="judged, no human label")
    cols[5].metric("Human labels", f"{c['human_labels']:,}")

with ui.guarded("Success over time"):
    st.subheader("Success over time")
    df: pl.DataFrame = data.get("success_over_time")
    if df.is_empty():
        st.caption("No trajectories yet.")
    else:
        by = (
            st.segmented_control(
                "Group by", ["policy", "suite", "split", "site"], default="policy", key="ov_by"
            )
            or "policy"
        )
        rates = (
            df.group_by("day", by)
            .agg(pl.col("success").sum(), pl.col("decided").sum(), pl.col("trajectories").sum())
            .with_columns(
                (pl.col("success") / pl.when(pl.col("decided") > 0).then(pl.col("decided"))).alias(
                    "success_rate"
                )
            )
            .sort("day", by)
        )
        if rates.get_column("day").n_unique() > 1:
            wide = rates.pivot(on=by, index="day", values="success_rate").sort("day")
            st.line_chart(wide.to_pandas().set_index("day"))
        st.dataframe(rates, hide_index=True, key="ov_rates")

with ui.guarded("Infrastructure errors"):
    st.subheader("Infrastructure errors and timeouts")
    errs: pl.DataFrame = data.get("infra_errors")
    if errs.is_empty():
        st.caption("None.")
    else:
        st.dataframe(errs, hide_index=True, key="ov_infra")
