"""Trajectories: filter, then step through one with its screenshot and the action drawn on it,
the model output, parsed action and action error, PRM scores of the candidates at that state,
judge rationales and per-criterion verdicts, interventions and labels.

Keys: Left / Right previous / next step, K / J previous / next trajectory. Deep link:
``?traj=<id>&step=<n>``.
"""

from __future__ import annotations

import json

import polars as pl
import streamlit as st

from dashboards import data, ui, widgets
from dashboards.queries import TrajectoryFilter
from warehouse.records import LABELS, TRAJECTORY_STATUSES

st.title("Trajectories")
ui.require_warehouse()


def filters(opts: dict[str, list[str]]) -> TrajectoryFilter:
    sb = st.sidebar
    sb.header("Filter")
    run = sb.selectbox("Run", [None, *opts["runs"]], format_func=lambda v: v or "all", key="f_run")
    task = sb.text_input("Task id contains", key="f_task")
    site = sb.selectbox(
        "Site", [None, *opts["sites"]], format_func=lambda v: v or "all", key="f_site"
    )
    split = sb.selectbox(
        "Split", [None, *opts["splits"]], format_func=lambda v: v or "all", key="f_split"
    )
    statuses = sb.multiselect("Status", list(TRAJECTORY_STATUSES), key="f_status")
    judge = sb.selectbox(
        "Judge", [None, *opts["judges"]], format_func=lambda v: v or "any judge", key="f_judge"
    )
    verdict = sb.selectbox(
        "Judge verdict",
        [None, "success", "failure", "abstain", "error"],
        format_func=lambda v: v or "any",
        key="f_verdict",
    )
    disagree = sb.selectbox(
        "Judge disagreement",
        [None, True, False],
        format_func=lambda v: {None: "any", True: "disagreements only", False: "agreed"}[v],
        key="f_disagree",
    )
    label = sb.selectbox(
        "Human label",
        [None, "none", *LABELS],
        format_func=lambda v: {None: "any", "none": "not labelled"}.get(v, v),
        key="f_label",
    )
    return TrajectoryFilter(
        run=run,
        task=task or None,
        site=site,
        split=split,
        statuses=tuple(statuses),
        judge=judge,
        verdict=verdict,
        disagreement=disagree,
        label=label,
    )


def pick_trajectory(listing: pl.DataFrame) -> str | None:
    ids, linked = ui.deep_link("traj", listing.get_column("traj_id").to_list(), "traj_sel")
    if not ids:
        return None
    if linked:
        step = st.query_params.get("step", "0")
        st.session_state["step_sel"] = int(step) if step.isdigit() else 0
    labels = {
        r["traj_id"]: f"{r['traj_id']} · {r['task_id']} · {r['status']}"
        for r in listing.select("traj_id", "task_id", "status").iter_rows(named=True)
    }

    def move(delta: int) -> None:
        i = ids.index(st.session_state["traj_sel"]) + delta
        st.session_state["traj_sel"] = ids[max(0, min(len(ids) - 1, i))]
        st.session_state["step_sel"] = 0

    c1, c2, c3 = st.columns([4, 1, 1], vertical_alignment="bottom")
    c1.selectbox(
        "Trajectory",
        ids,
        format_func=lambda t: labels.get(t, t),
        key="traj_sel",
        on_change=lambda: st.session_state.update(step_sel=0),
    )
    c2.button("◀ trajectory", on_click=move, args=(-1,), shortcut="K", key="prev_traj")
    c3.button("trajectory ▶", on_click=move, args=(1,), shortcut="J", key="next_traj")
    return st.session_state["traj_sel"]


def pick_step(n: int) -> int:
    cur = int(st.session_state.get("step_sel", 0) or 0)
    st.session_state["step_sel"] = max(0, min(n - 1, cur))

    def move(delta: int) -> None:
        st.session_state["step_sel"] = max(0, min(n - 1, st.session_state["step_sel"] + delta))

    c1, c2, c3 = st.columns([4, 1, 1], vertical_alignment="bottom")
    c1.number_input("Step", min_value=0, max_value=n - 1, step=1, key="step_sel")
    c2.button("◀ step", on_click=move, args=(-1,), shortcut="Left", key="prev_step")
    c3.button("step ▶", on_click=move, args=(1,), shortcut="Right", key="next_step")
    return int(st.session_state["step_sel"])


def header(t: dict) -> None:
    cols = st.columns(5)
    cols[0].metric("Status", t["status"])
    cols[1].metric("Steps", t["n_steps"])
    cols[2].metric("Policy", t["policy"])
    cols[3].metric("Site", t.get("site") or "?")
    cols[4].metric("Split", t.get("split") or "?")
    st.caption(f"run {t['run_id']} · task {t['task_id']} · group {t.get('group_id') or '-'}")
    widgets.untrusted("Instruction", t.get("instruction"))
    if t["status"] == "running":
        st.warning("This trajectory is still being written: the steps so far are shown.")
    if t.get("error"):
        widgets.untrusted("Trajectory error", t["error"])
    widgets.untrusted("Answer", t.get("answer"))


def step_view(view, idx: int, norm1000: bool) -> None:
    s = view.step(idx)
    if s is None:
        st.info(f"Step {idx} is not stored (yet).")
        return
    action = json.loads(s["action"]) if s["action"] else None
    target = (action or {}).get("target") or {}
    box = data.element_box(s["a11y_hash"], target.get("ref")) if target.get("ref") else None
    left, right = st.columns([3, 2])
    with left:
        png, what = data.annotated_screenshot(s["screenshot_hash"], s["action"], box, norm1000)
        if png is None:
            st.warning(f"No screenshot: {ui.md_escape(what)}")
        else:
            st.image(png, width="stretch", output_format="PNG")
            st.text(f"Drawn: {what}")
        st.text(f"URL: {s['url'] or '-'}\nTitle: {s['title'] or '-'}")
    with right:
        widgets.untrusted("Parsed action", s["action_text"])
        if s["action_error"]:
            widgets.untrusted("Action error", s["action_error"])
        widgets.untrusted("Model output", s["model_output"])
        scores = view.scores_at(idx)
        st.caption("PRM scores of the candidates at this state")
        if scores.is_empty():
            st.text("none scored")
        else:
            st.dataframe(scores, hide_index=True, key="scores")


def judgments(view) -> None:
    st.subheader("Judgments")
    if not view.judgments:
        st.caption("Not judged yet.")
    for j in view.judgments:
        with st.container(border=True):
            head = f"{j['judge']} v{j['judge_version']}"
            if j["error"]:
                st.text(f"{head}: judge error")
                widgets.untrusted("Error", j["error"])
                continue
            st.text(f"{head}: {j['verdict']} (score {j['score']})")
            if j["rationale"]:
                widgets.untrusted("Rationale", j["rationale"])
            if j["criteria"]:
                st.dataframe(pl.DataFrame(j["criteria"]).cast(pl.Utf8), hide_index=True)


ok = True
with ui.guarded("The trajectory list"):
    f = filters(data.get("filter_options"))
    listing: pl.DataFrame = data.get("trajectory_list", f)
    st.caption(
        f"{listing.height} trajectories match" + (" (first 500)" if listing.height >= 500 else "")
    )
    traj_id = pick_trajectory(listing)
    if traj_id is None:
        st.info(
            "No trajectory matches these filters."
            if any(v not in (None, (), "") for v in f.__dict__.values() if v != 500)
            else "No trajectories yet: collect some with `webloop collect` or `webloop demo`."
        )
        st.stop()
    view = data.get("trajectory_view", traj_id)
    if view is None:
        st.error(f"No trajectory {ui.md_escape(repr(traj_id))} in the warehouse.")
        st.stop()
    t = view.trajectory
    ui.set_param("traj", traj_id)
    header(t)
    n = view.steps.height
    if n == 0:
        st.info(
            "No steps stored for this trajectory" + (" yet." if t["status"] == "running" else ".")
        )
    else:
        idx = pick_step(n)
        ui.set_param("step", idx)
        step_view(view, idx, t.get("coords") == "norm1000")
    judgments(view)
    if not view.interventions.is_empty():
        st.subheader("Interventions")
        st.dataframe(view.interventions, hide_index=True, key="interventions")
    st.subheader("Human labels")
    if view.labels.is_empty():
        st.caption("None yet.")
    else:
        st.dataframe(view.labels, hide_index=True, key="labels")
    widgets.label_form(traj_id, n, key="traj")
