"""Label: a queue of unlabelled trajectories (judge disagreements first, then low-confidence
verdicts), and the form that writes success / failure / not executable, the first wrong step,
a note and the reviewer to ``human_labels``. Deep link: ``?traj=<id>``."""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboards import data, queries, ui, widgets

st.title("Label")
ui.require_warehouse()

ORDERS = {
    "Disagreements first": "priority",
    "Random sample (debiases a judge's success rate)": "random",
}
order = ORDERS[st.radio("Queue order", list(ORDERS), horizontal=True, key="queue_order")]

with ui.guarded("The labelling queue"):
    queue: pl.DataFrame = data.get("label_queue", 200, order)
    ids, _ = ui.deep_link("traj", queue.get_column("traj_id").to_list(), "label_sel")
    st.caption(
        f"{queue.height} unlabelled trajectories in the queue"
        + (" (first 200)" if queue.height >= 200 else "")
        + (
            ": disagreements first, then low-confidence verdicts, then unjudged, then agreed."
            if order == "priority"
            else ": in a random order. Labels made here are a uniformly random sample: "
            "`webloop eval` debiases a model judge's success rate with them."
        )
    )
    if not ids:
        ui.nothing_yet(
            "trajectories to label",
            "Every ended trajectory has a human label, or none has been collected yet.",
        )
        st.stop()
    if not queue.is_empty():
        counts = queue.group_by("reason").len().sort("reason")
        st.dataframe(counts, hide_index=True, key="queue_counts")
    reasons = dict(queue.select("traj_id", "reason").iter_rows())
    traj_id = st.selectbox(
        "Trajectory",
        ids,
        format_func=lambda t: f"{t} · {reasons.get(t, 'linked')}",
        key="label_sel",
    )
    ui.set_param("traj", traj_id)
    view = data.get("trajectory_view", traj_id)
    if view is None:
        st.error(f"No trajectory {ui.md_escape(repr(traj_id))} in the warehouse.")
        st.stop()
    t = view.trajectory
    st.text(f"{t['status']} · {t['n_steps']} steps · {t['policy']} · task {t['task_id']}")
    widgets.untrusted("Instruction", t.get("instruction"))
    widgets.untrusted("Answer", t.get("answer"))
    verdicts = [
        f"{j['judge']} v{j['judge_version']}: {j['verdict'] or 'error'}" for j in view.judgments
    ]
    st.text("Judges: " + ("; ".join(verdicts) if verdicts else "not judged"))
    if not view.steps.is_empty():
        st.dataframe(
            view.steps.select("step_idx", "url", "action_text", "action_error"),
            hide_index=True,
            key="label_steps",
        )
    widgets.trajectory_link(traj_id, label="step through it")
    source = queries.RANDOM_QUEUE if order == "random" else "dashboard"
    widgets.label_form(traj_id, view.steps.height, key="queue", source=source)
