"""Named evaluation protocols: an Online-Mind2Web run imported from files is re-judged under three
protocols through the CLI (the judge model is a local OpenAI-protocol server that decides from
what each protocol shows it: no judge model can run here), and the side-by-side table with its
paired agreement prints and is stored for the dashboard."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from judging.protocols import PROTOCOLS, EvalProtocol, get_protocol, register_protocol
from stages.config import ConfigError
from stages.judge import JudgeConfig, build_judge, check_judge_fits, with_protocol
from tests.cli.cli_runner import webloop
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from tests.warehouse.test_om2w import make_task, png
from warehouse import Warehouse, WarehouseConfig
from warehouse.records import ProtocolComparison

GREEN, RED = (0, 200, 0), (200, 0, 0)


def colours(body: dict) -> list[tuple[int, int, int]]:
    """The colour of each image the judge was shown, in order."""
    out = []
    for c in body["messages"][-1]["content"]:
        if isinstance(c, dict) and c.get("type") == "image_url":
            raw = base64.b64decode(c["image_url"]["url"].split(",", 1)[1])
            out.append(Image.open(io.BytesIO(raw)).convert("RGB").getpixel((0, 0)))
    return out


def judge_model(body: dict) -> str:
    """Decides from the evidence each protocol sends: the key-point judge and the one-call
    outcome judge look at the final page; the WebVoyager-style judge (no action history, the
    last 3 screenshots) is lenient: any green page is a success."""
    text = last_user_text(body)
    if "List the key points" in text:
        return "1. find the opening hours\n2. of the right store"
    shown = colours(body)
    # webjudge's verdict call and the outcome judge show the actions: the final page decides
    ok = shown[-1] == GREEN if "Action history" in text else GREEN in shown
    return json.dumps({"verdict": "success" if ok else "failure", "rationale": "seen"})


def om2w_home(tmp_path: Path) -> Path:
    """Six imported Online-Mind2Web trajectories with human labels: the final screenshot shows
    the answer page (green) or an error (red); t03's middle page was green."""
    root, home = tmp_path / "om2w", tmp_path / "home"
    final = {"t01": RED, "t02": GREEN, "t03": RED, "t04": GREEN, "t05": RED, "t06": GREEN}
    for tid, colour in final.items():
        folder = make_task(root, tid, n_shots=3, n_actions=2)
        (folder / "trajectory" / "2_full_screenshot.png").write_bytes(png(colour))
    (root / "t03" / "trajectory" / "1_full_screenshot.png").write_bytes(png(GREEN))
    labels = tmp_path / "human_label.json"
    labels.write_text(json.dumps({"t01": 1, "t02": 1, "t03": 0, "t04": 1, "t05": 0, "t06": 1}))
    webloop(home, "import", "om2w", str(root), "--labels", str(labels), "--run", "om2w")
    return home


def test_an_om2w_run_rejudged_under_three_protocols(prefect_harness, tmp_path: Path, monkeypatch):
    home = om2w_home(tmp_path)
    names = ("outcome", "webvoyager", "webjudge")
    with FakeOpenAI([], default=("fn", judge_model)) as fake:
        for name in names:
            out = webloop(
                home, "judge", "--protocol", name, "--base-url", fake.url, "--model", "m",
                "--run", "om2w",
            ).stdout  # fmt: skip
            assert "judged 6" in out, out
        again = webloop(
            home, "judge", "--protocol", "outcome", "--base-url", fake.url, "--model", "m",
            "--run", "om2w",
        ).stdout  # fmt: skip
        assert "judged 0" in again  # idempotent: nothing left under this protocol
        calls = list(fake.requests)
    # each protocol showed the judge what it says: the outcome judge the final page with the
    # actions, WebVoyager's the last 3 pages without them, WebJudge key points then 3 pages
    outcome = [b for b in calls if "Action history" in last_user_text(b) and "Key points" not in
               last_user_text(b)]  # fmt: skip
    voyager = [b for b in calls if "Final answer" in last_user_text(b) and "Action history" not
               in last_user_text(b)]  # fmt: skip
    webjudge = [b for b in calls if "Key points" in last_user_text(b)]
    assert [len(colours(b)) for b in outcome] == [1] * 6
    assert [len(colours(b)) for b in voyager] == [3] * 6
    assert [len(colours(b)) for b in webjudge] == [3] * 6

    out = webloop(home, "eval", "protocols", "om2w", "--protocols", ",".join(names)).stdout
    assert "6 judged under every protocol" in out
    assert "3/6 (50.0%)" in out and "4/6 (66.7%)" in out  # outcome, webjudge; webvoyager
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        rows = {(r.protocol, r.other): r for r in wh.records(ProtocolComparison)}
        by_protocol = dict(
            wh.sql("SELECT j.protocol, count(*) FROM judgments j GROUP BY ALL").iter_rows()
        )
    assert by_protocol == {get_protocol(n).hash: 6 for n in names}
    assert rows["outcome", None].successes == 3 and rows["webvoyager", None].successes == 4
    assert rows["outcome", None].protocol_hash == get_protocol("outcome").hash
    pair = rows["outcome", "webvoyager"]  # t03: only WebVoyager's lenient judge says success
    assert (pair.n, pair.agree, pair.only_this, pair.only_other) == (6, 5, 0, 1)
    assert pair.mcnemar_p == 1.0
    webjudge_pair = rows["outcome", "webjudge"]
    assert (webjudge_pair.agree, webjudge_pair.kappa) == (6, 1.0)
    # against people (t01 t02 t04 t06 succeeded): outcome misses t01; webvoyager also
    # passes t03. kappa: outcome (5/6 - 1/2) / (1/2) = 2/3; webvoyager (2/3 - 5/9) / (4/9)
    assert rows["outcome", "human"].agree == 5
    assert rows["outcome", "human"].kappa == pytest.approx(2 / 3)
    assert rows["webvoyager", "human"].agree == 4
    assert rows["webvoyager", "human"].kappa == pytest.approx(0.25)
    # and the dashboard's page shows that table
    page = dashboard_page(monkeypatch, home, "protocols")
    own = next(d.value for d in page.dataframe if "ci_low" in d.value.columns)
    assert own.set_index("protocol")["successes"].to_dict() == {
        "outcome": 3, "webjudge": 3, "webvoyager": 4
    }  # fmt: skip
    human = next(d.value for d in page.dataframe if "human_successes" in d.value.columns)
    assert human.set_index("protocol")["accuracy"].to_dict() == pytest.approx(
        {"outcome": 5 / 6, "webjudge": 5 / 6, "webvoyager": 4 / 6}
    )


def dashboard_page(monkeypatch, home: Path, name: str):
    """The dashboard's page ``name`` after one run (AppTest) on the warehouse of ``home``."""
    from streamlit.testing.v1 import AppTest

    from tests.dashboards.conftest import APP, use_home

    use_home(monkeypatch, home)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.switch_page(f"views/{name}.py")
    at = at.run()
    assert not at.exception and not at.error, (at.exception, at.error)
    return at


def test_a_judgment_of_an_earlier_protocol_version_is_judged_again(prefect_harness, tmp_path: Path):
    home = om2w_home(tmp_path)
    args = ("--base-url", "URL", "--model", "m", "--run", "om2w")
    with FakeOpenAI([], default=("fn", judge_model)) as fake:
        run = [a.replace("URL", fake.url) for a in args]
        for name in ("outcome", "webvoyager"):
            webloop(home, "judge", "--protocol", name, *run)
        with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
            wh.con.execute(  # as if judged under an older version of the outcome prompts
                "UPDATE judgments SET protocol = 'old-outcome-hash' WHERE protocol = $p AND "
                "traj_id = (SELECT min(traj_id) FROM judgments WHERE protocol = $p)",
                {"p": get_protocol("outcome").hash},
            )
        out = webloop(home, "eval", "protocols", "om2w").stdout  # every protocol with verdicts
        assert "5 judged under every protocol" in out
        assert "1 judgments were made under protocol hash old-outcome-hash" in out
        again = webloop(home, "judge", "--protocol", "outcome", *run).stdout
    assert "judged 1" in again
    out = webloop(home, "eval", "protocols", "om2w").stdout
    assert "6 judged under every protocol" in out and "old-outcome-hash" not in out


def test_protocols_fix_their_judge_and_options():
    cfg = with_protocol(JudgeConfig(protocol="webjudge", base_url="http://h/v1", model="m"))
    assert cfg.judge == "rubric_vlm" and cfg.judge_options()["selection"] == "model"
    with pytest.raises(ConfigError, match="fixes k"):
        with_protocol(JudgeConfig(protocol="webjudge", k=8))
    with pytest.raises(ConfigError, match="fixes last_k"):
        with_protocol(JudgeConfig(protocol="outcome", options={"last_k": 2}))
    with pytest.raises(ConfigError, match="judges with outcome_vlm"):
        with_protocol(JudgeConfig(protocol="outcome", judge="ensemble"))
    with pytest.raises(ConfigError, match="unknown evaluation protocol 'nope'"):
        with_protocol(JudgeConfig(protocol="nope"))
    # a stage's own judge (an evaluation's, RL's, the flywheel's) takes no protocol
    with pytest.raises(ConfigError, match=r"eval\.judge: protocol 'outcome' is for re-judging"):
        check_judge_fits(JudgeConfig(protocol="outcome"), "bundled", "eval.judge", "own grading")
    # a run without a protocol keeps its id; one with a protocol names it by its hash
    assert "protocol" not in JudgeConfig().identity()
    named = JudgeConfig(protocol="checkers").identity()
    assert named["protocol"] == get_protocol("checkers").hash


def test_a_protocol_hash_is_its_substance_and_names_are_registered_once():
    outcome = get_protocol("outcome")
    same = EvalProtocol("copy", outcome.judge, dict(outcome.options))
    assert same.hash == outcome.hash  # the name is not part of what decides verdicts
    other = EvalProtocol("copy", outcome.judge, {**outcome.options, "last_k": 2})
    assert other.hash != outcome.hash
    assert len({p.hash for p in PROTOCOLS.values()}) == len(PROTOCOLS)
    with pytest.raises(ValueError, match="registered already"):
        register_protocol(EvalProtocol("outcome", "outcome_vlm", {"last_k": 5}))
    with pytest.raises(ValueError, match="unknown judge"):
        register_protocol(EvalProtocol("mine", "no_such_judge"))
    with pytest.raises(ValueError, match="reserved"):
        register_protocol(EvalProtocol("human", "outcome_vlm"))
    # options are the judge's constructor parameters: a misspelt one is refused by name
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['last_kk'\]; known: \["):
        register_protocol(EvalProtocol("typo", "outcome_vlm", {"last_kk": 2}))
    cfg = JudgeConfig(judge="outcome_vlm", base_url="http://h/v1", model="m", options={"kk": 1})
    with pytest.raises(ConfigError, match=r"^judge 'outcome_vlm': unknown option\(s\) \['kk'\]"):
        build_judge(cfg)
    assert {"checkers", "outcome", "webvoyager", "webjudge"} <= set(PROTOCOLS)
    assert all(p.follows for p in PROTOCOLS.values())
