"""Secret files are owner-only from the start, whatever was at the path before."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from sites.secret_files import SecretFileError, read_secret_file, write_secret_file
from tests.sites.serve_process import serve_until_ready


@pytest.mark.slow  # a server process
def test_sites_serve_replaces_a_readable_secret_file_and_a_planted_link(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    secret = home / "sites.secret"
    secret.write_text("old secret")
    secret.chmod(0o644)  # left world-readable by an earlier version, or by hand
    proc, urls = serve_until_ready(home)
    try:
        assert set(urls) == {"shop", "travel", "wiki", "mail"}
        assert secret.stat().st_mode & 0o777 == 0o600
        value = read_secret_file(secret)
        assert value and value != "old secret"
        r = httpx.get(
            urls["mail"] + "/__webloop/state?session=x", headers={"X-Webloop-Secret": value}
        )
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)

    # A symlink planted at the path: replaced, never written through.
    victim = tmp_path / "victim.txt"
    victim.write_text("do not overwrite")
    secret.unlink()
    secret.symlink_to(victim)
    proc, urls = serve_until_ready(home)
    try:
        assert len(urls) == 4
        assert victim.read_text() == "do not overwrite"
        assert not secret.is_symlink() and secret.stat().st_mode & 0o777 == 0o600
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_write_secret_file_is_owner_only_even_with_a_permissive_umask(tmp_path: Path):
    old = os.umask(0)
    try:
        p = write_secret_file(tmp_path / "s", "abc")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o600 and read_secret_file(p) == "abc"
    assert [q.name for q in tmp_path.iterdir()] == ["s"]  # no temporary file left


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o666])
def test_reading_a_group_or_world_readable_secret_is_refused(tmp_path: Path, mode: int):
    p = tmp_path / "s"
    p.write_text("abc")
    p.chmod(mode)
    with pytest.raises(SecretFileError, match=f"mode {mode:04o}.*chmod 600"):
        read_secret_file(p)


def test_reading_a_link_or_a_missing_secret_is_refused(tmp_path: Path):
    target = write_secret_file(tmp_path / "real", "abc")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(SecretFileError, match="cannot open"):
        read_secret_file(link)
    with pytest.raises(SecretFileError, match="does not exist"):
        read_secret_file(tmp_path / "nope")
