"""Judges: agreement of each judge version with human and programmatic references (the stored
calibration metrics), prompt-injection flip rates, judge errors, and a disagreement list that
links to the trajectories."""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboards import data, ui, widgets

st.title("Judges")
ui.require_warehouse()

with ui.guarded("Agreement"):
    st.subheader("Agreement with references")
    agree: pl.DataFrame = data.get("agreements")
    if agree.is_empty():
        ui.nothing_yet(
            "calibration metrics",
            "Compute them with `webloop judge agreement --judge NAME --reference human` "
            "(or programmatic).",
        )
    else:
        st.dataframe(agree, hide_index=True, key="agreements")

with ui.guarded("Flip rates"):
    st.subheader("Prompt-injection flip rates")
    flips: pl.DataFrame = data.get("judge_flips")
    if flips.is_empty():
        st.caption("No judge has verdicts on trajectories the programmatic judge calls failures.")
    else:
        st.caption(
            "Among reference failures, the share a judge calls success; 'clean' is the "
            "judge's baseline false-positive rate."
        )
        st.dataframe(flips, hide_index=True, key="flips")

with ui.guarded("Judge errors"):
    st.subheader("Judge errors")
    errors: pl.DataFrame = data.get("judge_errors")
    if errors.is_empty():
        st.caption("None.")
    else:
        st.dataframe(errors, hide_index=True, key="judge_errors")

with ui.guarded("Disagreements"):
    st.subheader("Disagreements")
    dis: pl.DataFrame = data.get("judge_disagreements", 500)
    if dis.is_empty():
        st.caption("No judge disagrees with the programmatic verdicts or the human labels.")
    else:
        st.dataframe(dis.drop("rationale"), hide_index=True, key="disagreements")
        for tid in dis.get_column("traj_id").unique(maintain_order=True).head(20).to_list():
            widgets.trajectory_link(tid)
