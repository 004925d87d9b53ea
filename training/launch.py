"""Training on N processes: webloop's launcher (:func:`fit_processes`) and its worker
(``python -m training.launch JOB``).

The launcher writes the job (model to load, turns, trainer config, output folder) next to the
checkpoints, in ``.launch/job.json`` (JSON: reading it runs no code; see :func:`job_to_json`),
starts N ranks of this module on this machine (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` = 127.0.0.1 …, as ``torchrun`` sets them; each rank dies with the launcher), and
watches them. Rank 0 alone writes the checkpoints and reports each step's metrics, each
checkpoint and its progress as JSON lines in ``.launch/events.jsonl``; the launcher passes them
to the caller's callbacks as :func:`training.trainer.fit` would, so the caller (the training
stage, which writes the warehouse) sees no difference.

A rank that fails ends the run at once: the launcher stops the others (which would otherwise wait
in a collective for the lost rank) and raises one error naming the rank, how it ended, the last
step and the checkpoints kept. A rank that raised (bad data, a checkpoint of another run, a
non-finite loss) re-raises its error in the launcher. Running the same fit again resumes from the
last checkpoint, on any number of processes.

The worker reads the standard variables, so ``torchrun --nproc_per_node N -m training.launch
JOB`` (or ``accelerate launch``) runs a job file too, across nodes.

``.launch`` is private to the user who runs the launcher (mode 0700, fixed when it was not; a
link or another user's folder is refused), and every file in it is created anew, never
written through a link planted at its name (a new file, or a temporary one renamed over it).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.interface import DataMismatch, Turn
from training.load import ModelSpec
from training.parallel import ParallelConfig
from training.trainer import (
    CheckpointFn,
    CheckpointMismatch,
    CheckpointRefused,
    FitResult,
    LogFn,
    ProgressFn,
    TrainConfig,
    fit,
    list_checkpoints,
)
from warehouse.processes import die_with_parent

LAUNCH_DIR = ".launch"
EVENTS = "events.jsonl"
JOB_FILE = "job.json"
_JOB_FORMAT = 1
# errors a rank raises that the launcher raises again as they are (the caller's usage errors)
_RERAISED: dict[str, type[Exception]] = {
    "DataMismatch": DataMismatch,
    "CheckpointMismatch": CheckpointMismatch,
    "CheckpointRefused": CheckpointRefused,
    "FloatingPointError": FloatingPointError,
    "ValueError": ValueError,
}


class RankFailed(RuntimeError):
    """A training rank ended without finishing (killed, crashed): one line saying which, how,
    where the run stopped and what was kept."""


class LaunchFolderRefused(RuntimeError):
    """``.launch`` cannot be made private (a link, not a folder, another user's)."""


@dataclass(frozen=True)
class Job:
    """One fit, for its ranks to run."""

    model: ModelSpec
    turns: list[Turn]
    cfg: TrainConfig
    out_dir: str
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    ref_model: ModelSpec | None = None
    anchor: list[Turn] = field(default_factory=list)


# -- the job file: JSON, rebuilt field by field ---------------------------------------------------


def _init_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def job_to_json(job: Job) -> dict[str, Any]:
    """``job`` as JSON values: each record's fields by name (``model``/``ref_model``:
    :class:`ModelSpec`, ``cfg``: :class:`TrainConfig`, ``parallel``: :class:`ParallelConfig`,
    ``turns``/``anchor``: :class:`Turn` s whose ``images`` are sha256 hashes) and ``images``,
    each distinct image once (hash → base64). Floats keep every bit (JSON writes their repr)."""
    images: dict[str, str] = {}

    def turn(t: Turn) -> dict[str, Any]:
        hashes = []
        for data in t.images:
            digest = hashlib.sha256(data).hexdigest()
            images.setdefault(digest, base64.b64encode(data).decode("ascii"))
            hashes.append(digest)
        return {**_init_fields(t), "images": hashes}

    return {
        "format": _JOB_FORMAT,
        "model": _init_fields(job.model),
        "ref_model": None if job.ref_model is None else _init_fields(job.ref_model),
        "cfg": _init_fields(job.cfg),
        "out_dir": job.out_dir,
        "parallel": _init_fields(job.parallel),
        "turns": [turn(t) for t in job.turns],
        "anchor": [turn(t) for t in job.anchor],
        "images": images,
    }


def job_from_json(data: Any) -> Job:
    """The :class:`Job` of :func:`job_to_json`'s values: only these record types are built, by
    their constructors (which check their values); anything else raises ``ValueError``."""
    try:
        if data.get("format") != _JOB_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {_JOB_FORMAT}")
        images = {h: base64.b64decode(v, validate=True) for h, v in data["images"].items()}
        if any(hashlib.sha256(v).hexdigest() != h for h, v in images.items()):
            raise ValueError("an image does not match its hash")

        def turn(d: dict[str, Any]) -> Turn:
            ids, spans = d.get("reply_ids"), d.get("image_spans")
            return Turn(
                **{
                    **d,
                    "images": tuple(images[h] for h in d["images"]),
                    "reply_ids": None if ids is None else tuple(int(i) for i in ids),
                    "image_spans": None if spans is None else tuple(tuple(r) for r in spans),
                }
            )

        ref = data["ref_model"]
        return Job(
            model=ModelSpec(**data["model"]),
            turns=[turn(t) for t in data["turns"]],
            cfg=TrainConfig(**data["cfg"]),
            out_dir=str(data["out_dir"]),
            parallel=ParallelConfig(**data["parallel"]),
            ref_model=None if ref is None else ModelSpec(**ref),
            anchor=[turn(t) for t in data["anchor"]],
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a training job file ({type(exc).__name__}: {exc})") from None


def read_job(path: Path) -> Job:
    """The job in ``path`` (a :func:`write_job` file): JSON, so reading it runs no code."""
    try:
        return job_from_json(json.loads(path.read_bytes()))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a training job file ({exc})") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_job(job: Job) -> Path:
    """Make ``out_dir/.launch`` private, clear what an earlier launch left there and write the
    job file in it; its path."""
    launch = private_folder(Path(job.out_dir) / LAUNCH_DIR)
    stale = (*launch.glob("rank-*"), *launch.glob(".tmp-*"), launch / EVENTS, launch / "job.pkl")
    for old in stale:
        old.unlink(missing_ok=True)  # a link goes, not what it points to
    job_path = launch / JOB_FILE
    data = json.dumps(job_to_json(job), default=str)  # meta values JSON has no type for: text
    replace_file(job_path, data.encode())
    return job_path


# -- files no link can redirect -------------------------------------------------------------------


def private_folder(path: Path) -> Path:
    """``path`` as a folder only this user can enter (mode 0700), created if need be; the
    mode of one that exists is fixed. A link at ``path``, a file, or a folder of another user
    raise :class:`LaunchFolderRefused`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # (a link there too: refused below)
        path.mkdir(mode=0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
        raise LaunchFolderRefused(
            f"{path}: not a folder of its own ({exc.strerror}): a link or a file is in the "
            "way of the launcher's private folder; remove it and run again"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise LaunchFolderRefused(
                f"{path}: belongs to user {st.st_uid}, not to you ({os.getuid()}): the "
                "launcher's folder must be yours alone; remove it and run again"
            )
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def create_file(path: Path, append: bool = False) -> int:
    """A file descriptor of ``path`` opened for writing, mode 0600, never through a link at
    ``path`` (``O_NOFOLLOW``): a new file (``O_EXCL``: whatever is at ``path`` is refused), or
    with ``append`` the existing file or a new one."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_EXCL
    return os.open(path, flags, 0o600)


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a new temporary file beside ``path`` and rename it over ``path``
    (a link at ``path`` is replaced, never followed)."""
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with os.fdopen(create_file(tmp), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -- the launcher ---------------------------------------------------------------------------------


def fit_processes(
    job: Job,
    num_processes: int,
    *,
    log: LogFn | None = None,
    on_checkpoint: CheckpointFn | None = None,
    progress: ProgressFn | None = None,
    on_start: Callable[[list[int]], None] | None = None,
    poll_s: float = 0.1,
) -> FitResult:
    """Run ``job`` on ``num_processes`` ranks of this machine; as :func:`fit`, with the
    callbacks called here from rank 0's reports. ``on_start(pids)``: the ranks' process ids,
    in rank order, once they are started (a supervisor's, or a test's that kills one)."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    job_path = write_job(job)
    launch = job_path.parent
    procs = _start(job_path, num_processes)
    if on_start is not None:
        on_start([p.pid for p in procs])
    events = _Events(launch / EVENTS)
    handlers = {"log": log, "checkpoint": on_checkpoint, "progress": progress}
    try:
        while True:
            done = [p.poll() for p in procs]
            result = events.dispatch(handlers)  # (after poll: a rank's last lines are in)
            failed = [r for r, code in enumerate(done) if code not in (None, 0)]
            if failed:
                _stop(procs)
                events.dispatch(handlers)
                raise _failure(job, launch, _culprit(failed, procs), procs, events.last_step)
            if all(code == 0 for code in done):
                if result is None:
                    raise RankFailed(f"the ranks ended without rank 0's result (logs: {launch})")
                return result
            time.sleep(poll_s)
    finally:
        _stop(procs)


def _start(job_path: Path, n: int) -> list[subprocess.Popen]:
    """N ranks of the worker, each logging to ``.launch/rank-<r>.log``."""
    port = _free_port()
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // n))
    procs = []
    for rank in range(n):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
        }
        out = create_file(job_path.parent / f"rank-{rank}.log")
        argv = [sys.executable, "-m", "training.launch", str(job_path)]
        try:
            procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
                )
            )
        finally:
            os.close(out)
    return procs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Stop the ranks still running: SIGTERM, then SIGKILL after ``grace_s``."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class _Events:
    """Rank 0's reports, read as they are appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.last_step = 0
        self.result: FitResult | None = None

    def dispatch(self, handlers: dict[str, Callable | None]) -> FitResult | None:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line being written waits for the next read
            self.offset += end
            for line in data[:end].splitlines():
                self._one(json.loads(line), handlers)
        return self.result

    def _one(self, ev: dict[str, Any], handlers: dict[str, Callable | None]) -> None:
        kind = ev["event"]
        if kind == "result":
            fields = {**ev["result"], "final_checkpoint": Path(ev["result"]["final_checkpoint"])}
            self.result = FitResult(**fields)
            return
        if kind == "progress":
            self.last_step = ev["done"]
        handler = handlers.get(kind)
        if handler is None:
            return
        if kind == "log":
            handler(ev["step"], ev["metrics"])
        elif kind == "checkpoint":
            handler(ev["step"], Path(ev["path"]))
        else:
            handler(ev["done"], ev["total"])


def _culprit(failed: list[int], procs: list[subprocess.Popen]) -> int:
    """The rank that ended the run: one killed by a signal before one that raised (a rank whose
    peer vanished raises a connection error in its collective)."""
    killed = [r for r in failed if (procs[r].returncode or 0) < 0]
    return (killed or failed)[0]


def _failure(
    job: Job, launch: Path, rank: int, procs: list[subprocess.Popen], step: int
) -> Exception:
    """The error of a run whose rank ``rank`` ended first with a non-zero code."""
    error = launch / f"rank-{rank}.error.json"
    if error.exists():
        raised = json.loads(error.read_text())
        cls = _RERAISED.get(raised["type"])
        if cls is not None:
            return cls(raised["message"])
        how = f"raised {raised['type']}: {raised['message']}"
    else:
        code = procs[rank].returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
    kept = list_checkpoints(Path(job.out_dir))
    step = max(step, kept[-1][0] if kept else 0)  # (a checkpoint is written before its report)
    keep = (
        f"checkpoints up to step {kept[-1][0]} are kept in {job.out_dir}"
        if kept
        else "no checkpoint was written yet"
    )
    return RankFailed(
        f"training rank {rank} of {len(procs)} (pid {procs[rank].pid}) {how} after step "
        f"{step}; the other ranks were stopped; {keep}; run the same command again to resume "
        f"(rank logs: {launch})"
    )


# -- the worker -----------------------------------------------------------------------------------


class _Reporter:
    """Rank 0's reports: one JSON line each, flushed."""

    def __init__(self, path: Path) -> None:
        self.f = os.fdopen(create_file(path, append=True), "a", encoding="utf-8")

    def __call__(self, event: str, **values: Any) -> None:
        self.f.write(json.dumps({"event": event, **values}) + "\n")
        self.f.flush()


def worker(job_path: Path) -> None:
    """Run one rank of the job at ``job_path`` (rank and world from the environment)."""
    import torch

    job = read_job(job_path)
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    report = _Reporter(job_path.parent / EVENTS) if rank == 0 else None

    def log(step: int, metrics: dict[str, float]) -> None:
        if report is not None:
            report("log", step=step, metrics=metrics)

    def on_checkpoint(step: int, path: Path) -> None:
        if report is not None:
            report("checkpoint", step=step, path=str(path))

    def progress(done: int, total: int) -> None:
        if report is not None:
            report("progress", done=done, total=total)

    model = job.model.load()
    ref = job.ref_model.load() if job.ref_model is not None else None
    res = fit(
        model,
        job.turns,
        job.cfg,
        job.out_dir,
        ref_model=ref,
        anchor=job.anchor,
        log=log,
        on_checkpoint=on_checkpoint,
        progress=progress,
        parallel=job.parallel,
    )
    if report is not None:
        result = {**dataclasses.asdict(res), "final_checkpoint": str(res.final_checkpoint)}
        report("result", result=result)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m training.launch JOB_FILE", file=sys.stderr)
        return 2
    job_path = Path(args[0])
    rank = os.environ.get("RANK", "0")
    try:
        worker(job_path)
    except BaseException as exc:
        error = {"type": type(exc).__name__, "message": str(exc)}
        replace_file(job_path.parent / f"rank-{rank}.error.json", json.dumps(error).encode())
        traceback.print_exc()
        return 1
    finally:
        _leave_group()
    return 0


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
