"""The webloop review app: ``webloop dashboard`` (or ``streamlit run dashboards/app.py``).

One entry script; each page is a file under ``views/`` (UI only; not ``pages/``, which
Streamlit would also serve on its own, bypassing the navigation); data comes through the
cached query functions of :mod:`dashboards.data`. Deep links: ``/trajectories?traj=<id>&step=<n>``,
``/groups?group=<id>``, ``/label?traj=<id>``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts only this folder on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from dashboards import access  # noqa: E402

HERE = Path(__file__).resolve().parent
PAGES = [
    ("overview", "Overview", ":material/dashboard:"),
    ("trajectories", "Trajectories", ":material/timeline:"),
    ("label", "Label", ":material/rate_review:"),
    ("groups", "Groups", ":material/view_column:"),
    ("judges", "Judges", ":material/gavel:"),
    ("protocols", "Evaluation protocols", ":material/rule:"),
    ("datasets", "Datasets", ":material/dataset:"),
    ("training", "Training and evaluations", ":material/monitoring:"),
    ("sql", "SQL", ":material/terminal:"),
]


def main() -> None:
    st.set_page_config(page_title="webloop review", layout="wide")
    if not st.session_state.get("_access_granted"):
        if not access.token_ok(access.expected_token(), st.query_params.get("token")):
            st.error(
                "This dashboard needs its access token: open the URL that `webloop dashboard` "
                "printed (it ends in `?token=…`)."
            )
            st.stop()
        st.session_state["_access_granted"] = True  # the session keeps it across pages
    pages = [
        st.Page(
            str(HERE / "views" / f"{name}.py"),
            title=title,
            icon=icon,
            url_path=name,
            default=name == "overview",
        )
        for name, title, icon in PAGES
    ]
    wall, cpu = time.perf_counter(), time.thread_time()
    st.navigation(pages).run()
    # the page's server-side render time (this script run; bench/dashboard.py reads it)
    st.session_state["render_s"] = (time.perf_counter() - wall, time.thread_time() - cpu)


main()
