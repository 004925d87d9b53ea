"""One AppTest per page on the fixture warehouse (tests/dashboards/fixture.py), asserting the
values shown; plus the fresh-warehouse and empty-warehouse states of every page."""

from __future__ import annotations

import pytest

from tests.dashboards.conftest import use_home
from tests.dashboards.fixture import ANSWER, INSTRUCTION, LOSSES, MISSING_BLOB, PWN
from warehouse import Warehouse

PAGES = [
    "overview", "trajectories", "label", "groups", "judges", "protocols", "datasets", "training",
    "sql",
]  # fmt: skip


def texts(at, kind: str = "text") -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def frame(at, *columns: str):
    """The first table shown that has all of ``columns``."""
    for d in at.dataframe:
        if set(columns) <= set(d.value.columns):
            return d.value
    raise AssertionError(
        f"no table with columns {columns}: {[list(d.value.columns) for d in at.dataframe]}"
    )


def test_overview_counts(open_page):
    at = open_page("overview")
    assert not at.exception and not at.error
    m = metrics(at)
    # curation fixture: 13 (7 success, 3 failure, 1 running, 1 infra, 1 timeout) + 3 here
    assert (m["Trajectories"], m["Success"], m["Failure"]) == ("16", "8", "4")
    assert (m["Running"], m["Infra errors"], m["Timeouts"]) == ("2", "1", "1")
    assert m["Judge errors"] == "1" and m["Judge backlog"] == "2"  # t09 (timeout), tx-missing
    infra = frame(at, "traj_id", "error")
    assert sorted(infra["traj_id"]) == ["t08", "t09"]


def test_trajectory_step_viewer_deep_link_and_marker(open_page):
    at = open_page("trajectories", traj="tx-html", step="0")
    assert not at.exception
    assert at.selectbox(key="traj_sel").value == "tx-html"
    assert "Drawn: click at (100, 60)" in texts(at)
    code = texts(at, "code")
    assert "click(100, 60)" in code
    assert ANSWER in code and INSTRUCTION in code  # untrusted text shown verbatim, as text
    assert len(at.image) == 1
    m = metrics(at)
    assert (m["Status"], m["Steps"], m["Site"]) == ("success", "4", "shop")
    # next step (the button bound to the Right key): a type on an element with a stored box
    at.button(key="next_step").click().run()
    assert at.number_input(key="step_sel").value == 1
    assert "Drawn: type on e5 box (20, 30, 120x24) text 'kettle'" in texts(at)
    assert at.query_params["step"] == ["1"] or at.query_params["step"] == "1"
    at.button(key="next_step").click().run()
    assert "Drawn: scroll down" in texts(at)
    assert any(PWN in c for c in texts(at, "code"))  # model output with a script, as text
    rationale = [c for c in texts(at, "code") if c.startswith("The page shows the cart.")]
    assert rationale == [f"The page shows the cart. {PWN}"]


def test_trajectory_prm_scores_at_the_state(open_page):
    at = open_page("trajectories", traj="t03", step="3")
    assert not at.exception
    scores = frame(at, "cand_idx", "scorer")
    # latest score per candidate: cand 0 -> 0.8 (v2, newer than 0.1), cand 1 -> an error
    assert scores["cand_idx"].tolist() == [0, 1]
    assert scores["score"].tolist()[0] == 0.8
    assert scores["error"].tolist()[1] == "replay failed: browser closed"


@pytest.mark.parametrize(
    ("traj", "kind", "expected"),
    [
        ("tx-missing", "warning", f"No screenshot: screenshot unavailable: blob {MISSING_BLOB}"),
        ("tx-running", "warning", "This trajectory is still being written"),
        ("t06", "text", "vlm v1: judge error"),
        ("t09", "info", "No steps stored for this trajectory."),
    ],
)
def test_trajectory_broken_states(open_page, traj, kind, expected):
    at = open_page("trajectories", traj=traj)
    assert not at.exception
    assert any(t.startswith(expected) for t in texts(at, kind)), texts(at, kind)
    assert not at.error


def test_trajectory_filters(open_page):
    at = open_page("trajectories")
    at.selectbox(key="f_disagree").set_value(True).run()
    assert not at.exception
    ids = [o.split(" ")[0] for o in at.selectbox(key="traj_sel").options]
    # t04: programmatic success vs vlm failure; t05: vlm success vs programmatic failure
    assert sorted(ids) == ["t04", "t05"], ids
    at.selectbox(key="f_disagree").set_value(None)
    at.selectbox(key="f_verdict").set_value("error").run()
    assert [o.split(" ")[0] for o in at.selectbox(key="traj_sel").options] == ["t06"]


def test_label_queue_order_and_save(open_page, dash_home, monkeypatch):
    at = open_page("label")
    assert not at.exception
    first = at.selectbox(key="label_sel").value
    assert first in ("t04", "t05")  # disagreements come first
    top = at.selectbox(key="label_sel").options[:3]
    assert sorted(top[:2]) == ["t04 · disagreement", "t05 · disagreement"], top
    assert top[2].endswith("low confidence"), top
    # the reviewer defaults to the OS user (WEBLOOP_REVIEWER); emptied: refused, field named
    assert at.text_input(key="queue_reviewer").value
    at.text_input(key="queue_reviewer").set_value("")
    at.button[-1].click().run()
    assert any("Not saved: reviewer" in e for e in texts(at, "error"))
    at.radio(key="queue_label").set_value("failure")
    at.selectbox(key="queue_first").set_value("1")
    at.text_area(key="queue_note").set_value(f"wrong item {PWN}")
    at.text_input(key="queue_reviewer").set_value("ann")
    at.button[-1].click().run()
    assert not at.exception
    assert any(s.startswith("Saved: failure by ann") for s in texts(at, "success"))
    cfg = use_home(monkeypatch, dash_home)
    with Warehouse.open(cfg, migrate=False, read_only=True) as wh:
        rows = wh.sql(
            "SELECT step_idx, label, reviewer, note, source FROM human_labels "
            "WHERE traj_id = ? ORDER BY step_idx NULLS FIRST",
            [first],
        ).rows()
    assert rows == [
        (None, "failure", "ann", f"wrong item {PWN}", "dashboard"),
        (1, "failure", "ann", f"first wrong step: wrong item {PWN}", "dashboard"),
    ]


def test_the_random_label_queue_orders_by_a_seeded_hash_and_marks_its_labels(
    open_page, dash_home, monkeypatch
):
    at = open_page("label")
    priority = at.selectbox(key="label_sel").options
    at.radio(key="queue_order").set_value("Random sample (debiases a judge's success rate)").run()
    assert not at.exception
    shuffled = at.selectbox(key="label_sel").options
    ids = [o.split(" · ")[0] for o in shuffled]
    first = [o.split(" · ")[0] for o in priority]
    assert len(ids) > 5 and [t for t in first if t in ids] != ids  # not the priority order
    cfg = use_home(monkeypatch, dash_home)
    with Warehouse.open(cfg, migrate=False, read_only=True) as wh:
        from dashboards.queries import label_queue

        again = label_queue(wh, 200, "random")["traj_id"].to_list()
    assert [t for t in again if t in ids] == ids  # seeded: the same order
    chosen = at.selectbox(key="label_sel").value
    at.text_input(key="queue_reviewer").set_value("bo")
    at.button[-1].click().run()
    with Warehouse.open(cfg, migrate=False, read_only=True) as wh:
        row = wh.sql(
            "SELECT label, source FROM human_labels WHERE traj_id = ? AND reviewer = 'bo'",
            [chosen],
        ).rows()
    assert row == [("success", "random-queue")]


def test_groups_side_by_side(open_page):
    at = open_page("groups", group="run-model/task-3")
    assert not at.exception and not at.error
    g = frame(at, "reward", "advantage")
    assert g["traj_id"].tolist() == ["t06", "t12"]  # sorted by reward
    assert g["reward"].tolist() == [1.0, 0.0]
    assert [round(a, 3) for a in g["advantage"].tolist()] == [1.0, -1.0]
    assert "2 samples, 2 with a reward, mean reward 0.500" in texts(at)
    assert len(at.image) == 2  # the final screenshots


def test_judges(open_page):
    at = open_page("judges")
    assert not at.exception and not at.error
    ag = frame(at, "accuracy")
    assert ag["judge"].tolist() == ["vlm"] and ag["accuracy"].tolist() == [0.78]
    flips = frame(at, "flip_rate")
    assert flips.to_dict("records") == [
        {
            "judge": "vlm",
            "injection": "clean",
            "reference_failures": 1,
            "judged_success": 1,
            "flip_rate": 1.0,
        }
    ]
    dis = frame(at, "expected")
    prog = dis[dis["reference"] == "programmatic"]  # (the label test may add a human one)
    assert sorted(prog["traj_id"]) == ["t04", "t05"]
    assert prog.set_index("traj_id")["expected"].to_dict() == {"t04": "success", "t05": "failure"}
    errors = frame(at, "errors", "example")
    assert errors["example"].tolist() == ["model unavailable"]


def test_protocols(open_page):
    at = open_page("protocols")
    assert not at.exception and not at.error
    own = frame(at, "protocol_hash", "ci_low")
    assert own.set_index("protocol")["successes"].to_dict() == {"outcome": 3, "webjudge": 4}
    pairs = frame(at, "only_this", "mcnemar_p")
    assert pairs[["protocol", "other", "agree"]].values.tolist() == [["outcome", "webjudge", 5]]
    human = frame(at, "accuracy", "human_successes")
    assert human["accuracy"].tolist() == [pytest.approx(5 / 6)]
    assert any("6 trajectories every protocol judged" in c for c in texts(at, "caption"))


def test_datasets(open_page):
    at = open_page("datasets")
    assert not at.exception and not at.error
    assert metrics(at) == {"sft": "7", "trajectories": "3", "steps": "7"}
    comp = frame(at, "site", "policy", "steps")
    assert comp["trajectories"].sum() == 3
    assert sorted(comp["site"]) == ["shop", "travel", "wiki"]
    lin = frame(at, "checkpoint_id", "evaluations")
    assert lin[
        ["dataset_id", "training_run_id", "checkpoint_id", "evaluations"]
    ].values.tolist() == [["ds-1", "tr-1", "ck-1", 1]]
    assert any("## Gates" in c for c in texts(at, "code"))


def test_training_and_evaluations(open_page):
    at = open_page("training")
    assert not at.exception and not at.error
    assert f"loss: {len(LOSSES)} points, last {LOSSES[-1]:.4g}" in texts(at)
    ev = frame(at, "ci_low", "site")
    rows = {r["site"]: (r["n"], r["success_rate"]) for r in ev.to_dict("records")}
    assert rows == {"all": (20, 0.75), "shop": (12, 10 / 12), "wiki": (8, 0.625)}
    assert ev["ci_low"].tolist()[0] == 0.53


def test_sql_page_reads_and_refuses(open_page):
    at = open_page("sql")
    assert not at.exception
    at.text_area(key="sql_text").set_value(
        "SELECT status, count(*) AS n FROM trajectories GROUP BY status ORDER BY status"
    )
    at.button(key="sql_run").click().run()
    res = frame(at, "status", "n")
    assert dict(zip(res["status"], res["n"], strict=True))["success"] == 8
    assert at.get("download_button")
    at.text_area(key="sql_text").set_value("SELECT * FROM read_text('/etc/passwd')")
    at.button(key="sql_run").click().run()
    assert any(e.startswith("Refused:") for e in texts(at, "error"))
    assert not any("root:" in c for c in texts(at, "code"))


@pytest.mark.parametrize("page", PAGES)
def test_fresh_home_says_there_is_no_warehouse(open_page, tmp_path, page):
    home = tmp_path / "fresh"
    at = open_page(page, home=home)
    assert not at.exception
    assert any(i.startswith("No warehouse yet.") for i in texts(at, "info")), texts(at, "info")
    assert not home.exists()  # reading created nothing


@pytest.fixture(scope="module")
def empty_home(tmp_path_factory):
    from warehouse import WarehouseConfig

    home = tmp_path_factory.mktemp("empty") / "home"
    Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")).close()
    return home


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("overview", "No trajectories yet."),
        ("trajectories", "No trajectories yet"),
        ("label", "No trajectories to label yet."),
        ("groups", "No task groups yet."),
        ("judges", "No calibration metrics yet."),
        ("protocols", "No protocol comparisons yet."),
        ("datasets", "No datasets yet."),
        ("training", "No training runs yet."),
    ],
)
def test_empty_warehouse_states(open_page, empty_home, page, message):
    at = open_page(page, home=empty_home)
    assert not at.exception and not at.error
    assert any(i.startswith(message) for i in texts(at, "info")), texts(at, "info")
