"""Careless input at the command line: numbers out of range, runs that do not exist, URLs with
credentials, and a collect that collected nothing. Each is refused or reported with a non-zero
exit, and no secret reaches the output, the log file or the warehouse."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import typer

from cli.app import app
from tests.cli.cli_runner import webloop
from tests.rollouts.fake_openai import FakeOpenAI
from warehouse import Warehouse, WarehouseConfig, sample

KEY = "sk-live-Zq81mN0pQ4rT7"


def _numeric(annotation: object) -> bool:
    return annotation in (int, float) or any(a in (int, float) for a in typing.get_args(annotation))


def _commands(group: typing.Any, path: tuple[str, ...] = ()) -> typing.Iterator[tuple]:
    for name, sub in getattr(group, "commands", {}).items():
        if hasattr(sub, "commands"):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name), sub


def test_every_numeric_option_has_a_range() -> None:
    """``--n-tasks -1`` ran 15 of 16 tasks, ``--noise 5`` ran: every number has bounds."""
    unbounded = [
        (" ".join(path), p.name)
        for path, command in _commands(typer.main.get_command(app))
        for p in command.params
        if _numeric(getattr(getattr(p, "type_descriptor", None), "annotation", None))
        and p.min is None
        and p.max is None
    ]
    assert len(list(_commands(typer.main.get_command(app)))) > 30  # the walk sees the CLI
    assert unbounded == []


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    h = tmp_path_factory.mktemp("input") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        sample.load(wh, sample.generate(seed=2, n_tasks=2, samples=1))
    return h


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("collect", "--n-tasks", "-1"), "'--n-tasks'"),
        (("collect", "--samples", "-3"), "'--samples'"),
        (("collect", "--max-steps", "0"), "'--max-steps'"),
        (("collect", "--concurrency", "0"), "'--concurrency'"),
        (("collect", "--noise", "5"), "'--noise'"),
        (("tasks", "generate", "--n", "0"), "'--n'"),
        (("train", "rl", "--clip-eps", "0"), "'--clip-eps'"),
    ],
)
def test_numbers_out_of_range_exit_2_before_any_work(home: Path, args: tuple, says: str):
    res = webloop(home, *args, ok=False)
    assert res.returncode == 2 and says in res.stderr, res.stderr


@pytest.mark.parametrize("command", [("judge",), ("score-steps",), ("intervene",)])
def test_a_run_that_does_not_exist_is_a_usage_error(home: Path, command: tuple) -> None:
    """``judge --run nope`` said "judged 0" and exited 0."""
    res = webloop(home, *command, "--run", "nope", ok=False)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: --run: no run 'nope' in the warehouse (`webloop runs` lists them)"
    ]


def test_a_url_with_credentials_is_refused_and_never_printed_or_logged(home: Path) -> None:
    url = "http://user:hunter2-secret@127.0.0.1:9/v1"
    res = webloop(
        home, "collect", "--policy", "openai", "--model", "m", "--base-url", url, ok=False
    )
    assert res.returncode == 2 and "refusing a URL with credentials" in res.stderr
    assert "hunter2-secret" not in res.stdout + res.stderr
    assert "http://user:***@127.0.0.1:9/v1" in res.stderr
    log = home / "logs" / "webloop.log"
    assert not log.exists() or "hunter2-secret" not in log.read_text()


@pytest.mark.browser
def test_a_collect_whose_every_episode_got_a_401_exits_1_and_stores_no_key(
    prefect_harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model server refuses the key and echoes it in its 401 body (some providers do):
    exit 1 with what happened, and the key appears nowhere: not in the stored errors, the
    output or the log file."""
    from sites.tasks import generate
    from warehouse.tasks import put_tasks

    home = tmp_path / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        put_tasks(wh, generate(20, 0))
    monkeypatch.setenv("WEBLOOP_API_KEY", KEY)
    with FakeOpenAI([], default=("unauthorized", None)) as server:
        res = webloop(
            home,
            *("collect", "--n-tasks", "2", "--run", "bad-key", "--policy", "openai"),
            *("--base-url", server.url, "--model", "m"),
            ok=False,
        )
    assert server.headers and server.headers[0]["authorization"] == f"Bearer {KEY}"
    assert res.returncode == 1, res.stderr
    assert "all 2 episodes of run bad-key ended in an infrastructure error" in res.stderr
    assert "HTTP 401" in res.stderr and "Incorrect API key provided: ***" in res.stderr
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        errors = wh.sql("SELECT error FROM trajectories WHERE run_id = 'bad-key'")["error"]
        dump = str(wh.sql("SELECT * FROM trajectories").rows()) + str(
            wh.sql("SELECT * FROM runs").rows()
        )
    assert len(errors) == 2 and all("Incorrect API key provided: ***" in e for e in errors)
    assert KEY not in dump
    log = home / "logs" / "webloop.log"
    assert KEY not in res.stdout + res.stderr + (log.read_text() if log.exists() else "")


def test_control_characters_and_markup_in_data_do_not_reach_the_terminal(home: Path) -> None:
    """A cell that retitles the terminal window and carries rich markup is printed as text."""
    query = "SELECT chr(27) || ']0;pwned' || chr(7) || '[red]x[/red]' || chr(13) AS t"
    res = webloop(home, "sql", query)
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\r" not in res.stdout
    assert "\\x1b]0;pwned\\x07[red]x[/red]\\r" in res.stdout


def test_terminal_safe_keeps_text_and_escapes_controls() -> None:
    from cli.terminal import cell, terminal_safe

    assert terminal_safe("naïve — ok\tTab\nline") == "naïve — ok\tTab\nline"
    assert terminal_safe("a\x1b[2Jb\x9bc\x00") == "a\\x1b[2Jb\\x9bc\\x00"
    assert cell("[bold]x") == "\\[bold]x" and cell(None) == ""


def test_local_start_urls_need_allow_private_and_metadata_hosts_never_pass(tmp_path: Path):
    """Imported task files are third parties': a start URL on a loopback or private host is
    refused unless ``--allow-private`` says the file is one's own (local sites); link-local and
    cloud-metadata hosts stay refused even then."""
    home = tmp_path / "home"
    urls = {
        "local": "http://127.0.0.1:8711/",
        "intranet": "http://10.0.0.7/wiki",
        "meta": "http://169.254.169.254/latest/",
    }
    rows = [
        json.dumps({"task_id": k, "instruction": f"Do {k}.", "start_url": u, "rubric": ["done"]})
        for k, u in urls.items()
    ]
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(rows) + "\n")
    res = webloop(home, "tasks", "import", "rubric", str(f), ok=False)
    assert res.returncode == 2 and "no rubric task could be read" in res.stderr
    assert res.stderr.count("loopback, private or reserved") >= 2
    res = webloop(home, "tasks", "import", "rubric", str(f), "--allow-private")
    assert "2 tasks read: 2 new" in res.stdout
    assert "mine.jsonl:3" in res.stderr  # the metadata host, skipped with its line
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        ids = set(wh.sql("SELECT task_id FROM tasks").get_column("task_id").to_list())
    assert ids == {"local", "intranet"}
