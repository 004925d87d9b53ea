"""Groups: all G samples of one task group side by side (final screenshot, steps, reward,
GRPO advantage), best reward first. Deep link: ``?group=<id>``."""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboards import data, ui, widgets

st.title("Groups")
ui.require_warehouse()

with ui.guarded("The groups"):
    groups: pl.DataFrame = data.get("group_list", None, 500)
    if groups.is_empty():
        ui.nothing_yet(
            "task groups",
            "Groups are the G samples of one task (collect with `--samples G`).",
        )
        st.stop()
    ids, _ = ui.deep_link("group", groups.get_column("group_id").to_list(), "group_sel")
    info = {r["group_id"]: r for r in groups.iter_rows(named=True)}
    gid = st.selectbox(
        "Group",
        ids,
        format_func=lambda g: f"{g} · {info[g]['samples']} samples" if g in info else g,
        key="group_sel",
    )
    ui.set_param("group", gid)
    members: pl.DataFrame = data.get("group_members", gid)
    if members.is_empty():
        st.info(f"No trajectories in group {ui.md_escape(repr(gid))}.")
        st.stop()
    rewarded = members.filter(pl.col("reward").is_not_null())
    mean = rewarded.get_column("reward").mean() if rewarded.height else None
    st.text(
        f"{members.height} samples, {rewarded.height} with a reward, mean reward "
        + ("-" if mean is None else f"{mean:.3f}")
    )
    st.dataframe(
        members.select(
            "traj_id", "sample_idx", "status", "n_steps", "reward", "advantage", "last_action"
        ),
        hide_index=True,
        key="group_table",
    )
    per_row = 4
    rows = list(members.iter_rows(named=True))
    for start in range(0, len(rows), per_row):
        cols = st.columns(per_row)
        for col, m in zip(cols, rows[start : start + per_row], strict=False):
            with col, st.container(border=True):
                reward = "no reward" if m["reward"] is None else f"reward {m['reward']:.0f}"
                adv = "" if m["advantage"] is None else f", advantage {m['advantage']:+.2f}"
                st.text(f"#{m['sample_idx']} {m['status']} · {m['n_steps']} steps\n{reward}{adv}")
                png, why = data.raw_screenshot(m["final_screenshot"])
                if png is None:
                    st.caption(f"no final screenshot: {why}")
                else:
                    st.image(png, width="stretch", output_format="PNG")
                widgets.untrusted("Answer", m["answer"])
                widgets.trajectory_link(m["traj_id"], label="open")
