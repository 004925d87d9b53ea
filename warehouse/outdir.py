"""Where an export may write: one check for every command that takes an output folder OUT.

Exports create folders and files directly in OUT (Online-Mind2Web task folders named after task
ids, a dataset's ``<name>-<id>/`` and its temporary siblings), and they run as whoever started
them, root on CI and on the collection machines. So OUT is refused, before anything is created
or written, when:

- it is a filesystem root (``/``, ``C:\\``, or ``/.``, ``//``, ``/tmp/..`` …, which resolve to
  one): task folders named ``etc`` or ``usr`` would land in the system's own folders;
- it is itself a symbolic link (also a dangling one): the export would land wherever the link
  points, which is not the folder the command line names, and a link planted in a shared folder
  redirects the next export. Links further up the path (``/var`` → ``/private/var`` on macOS)
  are the system's layout and are followed.

Inside OUT, each exporter refuses links of its own (see ``warehouse.interop.om2w._inside``).
"""

from __future__ import annotations

import os
from pathlib import Path

from warehouse.connection import WarehouseError


class UnsafeOutputDir(WarehouseError):
    """OUT is a filesystem root or a symbolic link; nothing was written."""


def check_out_dir(out: str | Path) -> Path:
    """``out`` as a :class:`Path` if an export may write there, else :class:`UnsafeOutputDir`
    (see the module docstring). Call it before creating anything."""
    path = Path(out)
    if os.path.islink(path):
        target = os.readlink(path)
        raise UnsafeOutputDir(
            f"refusing to export into {path}: it is a symbolic link (to {target}); "
            "give the folder itself"
        )
    resolved = path.resolve()
    if resolved == Path(resolved.anchor) or resolved.parent == resolved:
        raise UnsafeOutputDir(
            f"refusing to export into {path}: it is the filesystem root {resolved}; "
            "give a folder for the export"
        )
    return path
