"""Secret values never land in the warehouse or the log file: keys from the environment, the
catalog password, and the password of any URL are masked in every text written."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from warehouse import Warehouse
from warehouse.records import Run, Trajectory
from warehouse.secrets import MASK, has_url_credentials, redact, register

KEY = "sk-proj-8Hd2LwQx91"


@pytest.fixture(autouse=True)
def key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to mask: ordinary text stays


def test_redact_masks_env_keys_registered_secrets_and_url_passwords() -> None:
    register("catalog-pw-771")
    text = f"401: bad key {KEY}; dsn postgresql://wl:catalog-pw-771@db/x; http://u:p4ss@h/v1 abc"
    out = redact(text)
    assert KEY not in out and "catalog-pw-771" not in out and "p4ss" not in out
    assert out.count(MASK) == 3 and out.endswith(" abc")  # "abc" (3 chars) is not masked
    assert has_url_credentials("http://u:p4ss@h/v1") and not has_url_credentials("http://h/v1")
    assert redact("nothing secret here") == "nothing secret here"


def test_no_written_row_holds_a_secret(wh: Warehouse) -> None:
    """A model server's 401 body that echoes the key, and a run config with a URL password,
    are stored masked (every string column of every write goes through the mask)."""
    wh.write([Run(run_id="r1", kind="collect", config={"base_url": "http://u:pw-9911@h/v1"})])
    wh.write(
        [
            Trajectory(
                traj_id="t1",
                run_id="r1",
                task_id="task",
                policy="openai",
                status="infra_error",
                error=f"model server refused the request: HTTP 401 Incorrect key {KEY}",
            )
        ]
    )
    dump = str(wh.sql("SELECT * FROM runs").rows()) + str(
        wh.sql("SELECT * FROM trajectories").rows()
    )
    assert KEY not in dump and "pw-9911" not in dump
    assert "Incorrect key ***" in dump and "http://u:***@h/v1" in dump


def test_the_log_file_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stages import logfile

    monkeypatch.setenv("WEBLOOP_LOG", str(tmp_path / "w.log"))
    handler = logfile.LogFileHandler()
    logger = logging.getLogger("webloop.test.secrets")
    logger.addHandler(handler)
    try:
        logger.error("request with key %s failed", KEY)
        logfile.log_exception(RuntimeError(f"echoed {KEY}"), "webloop collect")
    finally:
        logger.removeHandler(handler)
    text = (tmp_path / "w.log").read_text()
    assert "request with key *** failed" in text and "echoed ***" in text and KEY not in text
