"""Widgets used by more than one page: the label form, untrusted text, links to a trajectory."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboards import access, data, ui
from warehouse.records import LABELS

PAGES = Path(__file__).resolve().parent / "views"
LABEL_NAMES = {"success": "success", "failure": "failure", "not_executable": "not executable"}


def untrusted(label: str, text: str | None) -> None:
    """Show text that came from a page or a model: as plain text, never markdown or HTML."""
    st.caption(label)
    st.code(text if text not in (None, "") else "(none)", language=None, wrap_lines=True)


def label_form(traj_id: str, n_steps: int, *, key: str, source: str = "dashboard") -> None:
    """Success / failure / not executable, first wrong step, note, reviewer → human_labels
    (``source``: where the label was made)."""
    with st.form(f"label-{key}-{traj_id}", clear_on_submit=False, border=True):
        st.markdown("**Label this trajectory**")
        label = st.radio(
            "Label", LABELS, format_func=LABEL_NAMES.get, horizontal=True, key=f"{key}_label"
        )
        steps = ["none"] + [str(i) for i in range(max(n_steps, 0))]
        first = st.selectbox(
            "First wrong step", steps, key=f"{key}_first", help="for failures: where it went wrong"
        )
        note = st.text_area("Note", key=f"{key}_note", height=80)
        reviewer = st.text_input(
            "Reviewer",
            value=st.session_state.get("reviewer") or access.default_reviewer(),
            key=f"{key}_reviewer",
        )
        saved = st.form_submit_button("Save label", type="primary")
    if saved:
        try:
            rec = data.save_label(
                traj_id,
                str(label),
                reviewer,
                step_idx=None if first in (None, "none") else int(first),
                note=note,
                source=source,
            )
        except ValueError as exc:
            st.error(f"Not saved: {ui.md_escape(exc)}")
            return
        st.session_state["reviewer"] = rec.reviewer
        st.success(f"Saved: {rec.label} by {ui.md_escape(rec.reviewer)} ({rec.label_id})")


def trajectory_link(traj_id: str, step: int | None = None, *, label: str | None = None) -> None:
    params = {"traj": traj_id} | ({"step": str(step)} if step is not None else {})
    st.page_link(
        str(PAGES / "trajectories.py"),
        label=label or f"open {traj_id}",
        query_params=params,
        icon=":material/open_in_new:",
    )
