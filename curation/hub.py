"""Push an exported dataset folder to a Hugging Face Hub dataset repository.

What goes up is :func:`curation.export.hub_files`: the data card (its YAML ``configs`` name each
kind's Parquet file), the Parquet files, the recipe and the metadata; the ``save_to_disk``
folders stay local. On the Hub the repository then loads as the folder does:
``datasets.load_dataset("<repo>", "sft", split="train")``.

Pushes are private unless asked otherwise (``private=False``, the CLI's ``--public``): a new
repository is created private, and an existing public one is made private (the Hub's settings
call, :meth:`~huggingface_hub.HfApi.update_repo_settings`) before anything is uploaded; where
the Hub refuses that, nothing is uploaded and :class:`PushError` says why. ``--public`` creates
a new repository public and leaves an existing one's visibility as it is (a private repository
is made public on the Hub, by its owner, not by a push).

The token is huggingface_hub's own (the ``HF_TOKEN`` environment variable, or a ``hf auth
login``); webloop never reads, prints or stores it. ``HF_ENDPOINT`` points the client at another
Hub (a mirror, an enterprise Hub).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curation.export import HUB_PATTERNS, hub_files


class PushError(RuntimeError):
    """A push that could not happen (offline, refused, unreachable); the message says why."""


@dataclass(frozen=True)
class PushResult:
    """Where the dataset went: the repository, the commit, the files uploaded, and whether the
    repository is private (as the Hub reported it before the upload)."""

    repo_id: str
    commit_url: str
    files: tuple[str, ...]
    private: bool


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = True,
    message: str | None = None,
    api: Any = None,
) -> PushResult:
    """Create the dataset repository ``repo_id`` if needed (private unless ``private=False``),
    make an existing public one private when ``private`` (see the module docstring), and upload
    ``folder``'s Hub files in one commit. :class:`PushError` says why when the Hub cannot be
    reached or refuses."""
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    folder = Path(folder)
    files = hub_files(folder)
    if not any(str(f).startswith("parquet/") for f in files):
        raise PushError(f"{folder}: no parquet/ files to push (not a webloop export folder?)")
    if _offline():
        raise PushError("the Hub is not reachable in offline mode (HF_HUB_OFFLINE is set)")
    api = api or HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        is_private = _visibility(api, repo_id, private)
        info = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="dataset",
            allow_patterns=list(HUB_PATTERNS),
            commit_message=message or f"webloop dataset {folder.name}",
        )
    except OfflineModeIsEnabled:
        raise PushError(
            "the Hub is not reachable in offline mode (HF_HUB_OFFLINE is set)"
        ) from None
    except HfHubHTTPError as exc:
        raise PushError(f"the Hub refused the push to {repo_id}: {_first_line(exc)}") from None
    except (httpx.TransportError, OSError) as exc:  # connection refused, DNS, timeouts
        raise PushError(f"cannot reach the Hub to push {repo_id}: {_first_line(exc)}") from None
    return PushResult(repo_id, str(info.commit_url), tuple(str(f) for f in files), is_private)


def _visibility(api: Any, repo_id: str, private: bool) -> bool:
    """Whether the repository is private once this is done: when ``private``, a repository the
    Hub does not report private is made so; a refusal is a :class:`PushError` (nothing
    uploaded)."""
    from huggingface_hub.errors import HfHubHTTPError

    is_private = api.repo_info(repo_id, repo_type="dataset").private is True
    if not private or is_private:
        return is_private
    refusal = f"{repo_id} is public and the Hub did not make it private"
    advice = "nothing was pushed; make it private on the Hub, or pass --public to publish to it"
    try:
        api.update_repo_settings(repo_id, repo_type="dataset", private=True)
    except HfHubHTTPError as exc:
        raise PushError(f"{refusal} ({_first_line(exc)}): {advice}") from None
    if api.repo_info(repo_id, repo_type="dataset").private is not True:  # accepted, not done
        raise PushError(f"{refusal}: {advice}")
    return True


def _offline() -> bool:
    """huggingface_hub's offline switch, read now (its own constant is read at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
