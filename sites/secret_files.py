"""Files that hold a secret (the sites' inspection secret): owner-only from the first byte.

A secret file is written to a fresh temporary file created with mode 0600 (``O_CREAT|O_EXCL``,
then ``fchmod`` so a permissive umask cannot widen it) and renamed over the target, so an
existing file with a wider mode, or a symlink planted at the path, is replaced rather than
written through. Reading refuses a file that others could read or that another user owns.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

MODE = 0o600


class SecretFileError(RuntimeError):
    """A secret file is unsafe to use (mode, owner, not a regular file); the message says how."""


def write_secret_file(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600 (atomically; replaces what was there)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_secret_file(path: str | Path) -> str:
    """The secret in ``path``; refuses a link, another user's file or a group/world-readable one."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise SecretFileError(f"secret file {path} does not exist") from None
    except OSError as exc:
        raise SecretFileError(f"cannot open secret file {path} ({exc.strerror})") from None
    with os.fdopen(fd, encoding="utf-8") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"secret file {path} is not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise SecretFileError(f"secret file {path} belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise SecretFileError(
                f"secret file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read "
                f"it; run `chmod 600 {path}` (or delete it) and try again"
            )
        return fh.read().strip()
