"""SQL: a read-only query box over the warehouse (:mod:`warehouse.readonly`): results as a
table and a CSV download. It cannot read or write files, reach the network, attach
databases, load extensions or change data."""

from __future__ import annotations

import streamlit as st

from dashboards import data, ui
from warehouse.readonly import ReadOnlyQueryError

st.title("SQL")
st.caption(
    "Read-only SQL over the warehouse tables (trajectories, steps, judgments, …). "
    "Files, network, ATTACH, extensions and writes are refused."
)
ui.require_warehouse()

query = st.text_area(
    "Query",
    value=st.session_state.get(
        "sql_query",
        "SELECT status, count(*) AS n FROM trajectories GROUP BY status ORDER BY n DESC",
    ),
    height=140,
    key="sql_text",
)
max_rows = st.number_input("Row limit", min_value=1, max_value=100_000, value=1_000, key="sql_max")
if st.button("Run", type="primary", key="sql_run", shortcut="Ctrl+Enter"):
    st.session_state["sql_query"] = query
    with ui.guarded("The query"):
        try:
            res = data.user_query(query, int(max_rows))
        except ReadOnlyQueryError as exc:
            st.error(f"Refused: {ui.md_escape(exc)}")
        else:
            if res.frame.width == 0:
                st.info(f"ok ({res.statements} statement(s), no rows)")
            else:
                note = f" (first {max_rows:,}; more rows exist)" if res.truncated else ""
                st.caption(f"{res.frame.height:,} rows{note}")
                st.dataframe(res.frame, hide_index=True, key="sql_result")
                st.download_button(
                    "Download CSV",
                    res.frame.write_csv(),
                    file_name="webloop-query.csv",
                    mime="text/csv",
                    key="sql_csv",
                )
