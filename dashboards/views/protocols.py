"""Evaluation protocols: one run's trajectories under several named protocols, side by side
(the stored tables of ``webloop eval protocols RUN``): each protocol's success on the same
trajectories, their paired agreement, and their agreement with the human labels."""

from __future__ import annotations

import polars as pl
import streamlit as st

from dashboards import data, ui

st.title("Evaluation protocols")
ui.require_warehouse()

with ui.guarded("Protocols"):
    rows: pl.DataFrame = data.get("protocol_comparisons")
    if rows.is_empty():
        ui.nothing_yet(
            "protocol comparisons",
            "Judge a run under several protocols (`webloop judge --protocol NAME --run RUN`), "
            "then compare them with `webloop eval protocols RUN`.",
        )
    else:
        runs = rows.get_column("run_id").unique(maintain_order=True).to_list()
        run = st.selectbox("Run", runs, key="protocol_run")
        mine = rows.filter(pl.col("run_id") == run)
        own = mine.filter(pl.col("other").is_null())
        st.subheader("Success under each protocol")
        st.caption(
            f"On the {own.get_column('n').max()} trajectories every protocol judged. Each rate "
            "belongs to its protocol (name and hash); compare them only paired, as below."
        )
        st.dataframe(
            own.select(
                "protocol", "protocol_hash", "model", "successes", "n", "rate", "ci_low", "ci_high"
            ),
            hide_index=True,
            key="protocol_own",
        )
        st.subheader("Paired agreement between protocols")
        pairs = mine.filter(pl.col("other").is_not_null() & (pl.col("other") != "human"))
        st.dataframe(
            pairs.select(
                "protocol", "other", "n", "agree", "only_this", "only_other", "kappa", "mcnemar_p"
            ),
            hide_index=True,
            key="protocol_pairs",
        )
        st.subheader("Agreement with the human labels")
        human = mine.filter(pl.col("other") == "human")
        if human.is_empty():
            st.caption("No human labels on these trajectories.")
        else:
            st.dataframe(
                human.select(
                    "protocol",
                    "n",
                    (pl.col("agree") / pl.col("n")).alias("accuracy"),
                    "kappa",
                    "successes",
                    pl.col("other_successes").alias("human_successes"),
                ),
                hide_index=True,
                key="protocol_human",
            )
