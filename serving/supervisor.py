"""Model servers as supervised subprocesses: vLLM (from ``.venv-vllm``) or webloop's own ``hf``
engine (:mod:`serving.server`), both speaking the OpenAI protocol at ``http://HOST:PORT/v1``.

A :class:`ModelServer` starts the engine in its own process group, waits until ``/health``
answers, and stops the whole group (SIGTERM, then SIGKILL after a grace period), so no engine
process outlives it: vLLM's API server forks an engine-core process that a plain
``terminate()`` of the parent would orphan. :meth:`ModelServer.restart` swaps the served
checkpoint (weight sync for online RL) and measures how long the server was away;
:meth:`ModelServer.reload_weights` is vLLM's in-place alternative (0.32's dev-mode RPC
``reload_weights`` + ``reset_prefix_cache``: new weights from a folder into the running engine,
same port, no restart; webloop's ``hf`` engine serves the same call in dev mode);
:meth:`ModelServer.sync_weights` uses it where it can.

Dev mode is opt-in (``ServerSpec.dev_mode``) and loopback only. Each launch in dev mode draws a
random bearer token (:func:`secrets.token_urlsafe`), hands it to the engine in its environment
(never on its command line, never logged) and sends it with its reload calls; the engine's
development endpoints sit behind :class:`serving.standalone.devguard.DevGuard` (token, no
``Origin``, the bound ``Host``, JSON only, weights from inside ``ServerSpec.reload_root``):
webloop's ``hf`` engine wraps its app in it, vLLM loads it with ``--middleware`` (vLLM's own
``--api-key`` guards ``/v1`` only, not ``/collective_rpc``).

vLLM on CPUs needs ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache), offline hub access and float32
(facts in STACK-NOTES); on a CUDA machine the same command serves on the GPU.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import httpx

from serving.children import die_with_parent
from serving.standalone import devguard
from serving.standalone.devguard import MIN_TOKEN_CHARS, TOKEN_ENV, is_loopback
from warehouse.secrets import register as register_secret

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("hf", "vllm")
TINY_IDEFICS = "tiny-idefics"
SMOL_IDEFICS = "smol-idefics"
#: Model presets built offline on first use, by name: their builder in :mod:`training.models`.
PRESETS = {TINY_IDEFICS: "build_tiny_idefics", SMOL_IDEFICS: "build_smol_idefics"}


class ServerError(RuntimeError):
    """The model server could not start, or died."""


def vllm_python(root: Path = ROOT) -> Path | None:
    """The python of the vLLM environment (``make vllm``), or None when it is not built."""
    py = root / ".venv-vllm" / "bin" / "python"
    return py if py.exists() else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def preset_dir(name: str, home: str | Path | None = None) -> Path:
    """Where the preset ``name`` is built: ``HOME/models/NAME``, HOME being ``home``, else
    ``$WEBLOOP_HOME``, else ``.webloop``."""
    root = Path(home or os.environ.get("WEBLOOP_HOME") or ".webloop").absolute()
    return root / "models" / name


def tiny_idefics_dir(home: str | Path | None = None) -> Path:
    """Where the ``tiny-idefics`` preset is built (:func:`preset_dir`)."""
    return preset_dir(TINY_IDEFICS, home)


def resolve_model(model: str, home: str | Path | None = None) -> str:
    """A checkpoint folder for ``model``: a preset of :data:`PRESETS` (``tiny-idefics``: a tiny
    random Idefics3; ``smol-idefics``: SmolLM2-135M-Instruct as an Idefics3's text model) is
    built offline on first use under ``home`` (see :func:`preset_dir`); anything else must be
    an existing folder with a ``config.json``."""
    if model in PRESETS:
        out = preset_dir(model, home)
        if not (out / "config.json").exists():
            from training import models as builders

            build = getattr(builders, PRESETS[model])
            tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
            try:
                build(tmp)  # then renamed: a kill leaves no half-built folder
            except builders.ModelBuildError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise ServerError(f"--model {model}: {exc}") from None
            if not (out / "config.json").exists():
                shutil.rmtree(out, ignore_errors=True)  # a half folder from an older build
                tmp.rename(out)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        return str(out)
    path = Path(model)
    if not (path / "config.json").exists():
        presets = ", ".join(PRESETS)
        raise ServerError(
            f"--model {model!r}: not a checkpoint folder (no config.json) nor a preset ({presets})"
        )
    return str(path.absolute())


@dataclass
class ServerSpec:
    """What to serve, and how. ``name``: the model name clients send (default: the folder).
    ``max_model_len``: vLLM's context limit (None: the model's own; a large model on a CPU
    needs a smaller one to fit the KV cache). ``dev_mode``: serve the in-place weight reload
    (loopback only, behind the launch's token: see the module doc); ``reload_root``: the folder
    reloaded checkpoints must lie in (default: the served model's parent folder; symlinks are
    resolved before the comparison). ``extra``: more engine arguments (vLLM flags, e.g.
    ``--max-num-seqs 8``)."""

    engine: str
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    name: str | None = None
    max_model_len: int | None = None  # vLLM: None = the model's own maximum
    kv_cache_gib: int = 1
    dtype: str = "float32"  # vLLM: float32 on CPUs (facts in STACK-NOTES), bfloat16 on GPUs
    dev_mode: bool = False  # the in-place weight reload endpoints (loopback only, token)
    reload_root: str | None = None  # reloads from inside this folder only (None: model's parent)
    enforce_eager: bool = False  # vLLM: skip torch.compile / CUDA graphs (faster start-up)
    extra: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ServerError(f"unknown engine {self.engine!r}; choose from {', '.join(ENGINES)}")
        if self.dev_mode and not is_loopback(self.host):
            raise ServerError(
                f"dev mode (the weight-reload endpoint) is served on loopback only, not on "
                f"{self.host!r}: drop --dev-mode to bind another address"
            )
        if self.reload_root is None:
            self.reload_root = str(Path(self.model).absolute().parent)

    @property
    def served_name(self) -> str:
        return self.name or self.model

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def command(spec: ServerSpec, token: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``spec``'s engine; in dev mode, ``token`` (the
    launch's reload token) goes into the environment, and nowhere else."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    for key in (TOKEN_ENV, devguard.HOST_ENV, devguard.ROOT_ENV):
        env.pop(key, None)  # an engine gets the reload settings of its own launch only
    if spec.dev_mode and token is not None:
        env[TOKEN_ENV] = token
        env[devguard.HOST_ENV] = devguard.host_header(spec.host, spec.port)
        env[devguard.ROOT_ENV] = str(spec.reload_root)
    if spec.engine == "hf":
        argv = [sys.executable, "-m", "serving.server", "--model", spec.model]
        argv += ["--host", spec.host, "--port", str(spec.port), "--name", spec.served_name]
        if spec.dev_mode:
            argv += ["--dev-mode", "--reload-root", str(spec.reload_root)]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return argv + spec.extra, env
    py = vllm_python()
    if py is None:
        raise ServerError("--engine vllm needs the vLLM environment: run `make vllm` first")
    argv = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model]
    argv += ["--served-model-name", spec.served_name, "--host", spec.host]
    argv += ["--port", str(spec.port)]
    if spec.max_model_len is not None:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    argv += ["--dtype", spec.dtype, "--disable-log-stats"]
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(spec.kv_cache_gib),
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        TRANSFORMERS_OFFLINE="1",
    )
    # the project's packages must not shadow vLLM's environment: its import path gets the
    # standard-library-only guard of the dev endpoints, and nothing else of webloop
    env.pop("PYTHONPATH", None)
    if spec.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["PYTHONPATH"] = str(Path(devguard.__file__).parent)
        argv += ["--middleware", "devguard.DevGuard"]
    return argv + spec.extra, env


class ModelServer:
    """One supervised engine process group (see the module doc). A context manager::

    with ModelServer(ServerSpec("vllm", path, port=free_port())).start() as srv:
        OpenAI(base_url=srv.base_url, api_key="-")...
    """

    def __init__(
        self,
        spec: ServerSpec,
        log: str | Path | None = None,
        die_with_starter: bool = True,
        token: str | None = None,
    ) -> None:
        """``die_with_starter``: the kernel stops the engine when the thread that launched it
        ends, however it ends (SIGKILL included): launch from a thread that lives as long as
        the server should (pass False from a short-lived one and stop it yourself).
        ``token``: the bearer token of the dev endpoints (32+ characters; default: a new
        random one per launch, known to this object only)."""
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise ServerError(f"the reload token must have {MIN_TOKEN_CHARS}+ characters")
        self.spec = spec
        self.die_with_starter = die_with_starter
        self._fixed_token = token
        self._token: str | None = None  # this launch's
        self.log_path = Path(log) if log else None
        self.proc: subprocess.Popen | None = None
        self._log: IO[str] | None = None
        self.started_s = 0.0  # seconds the last start took until healthy
        self._t0 = 0.0

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout_s: float = 300) -> ModelServer:
        """Start the engine and wait until it is healthy (ServerError with its log tail when
        it dies or ``timeout_s`` passes)."""
        self.launch()
        return self.ready(timeout_s)

    def launch(self) -> ModelServer:
        """Start the engine's process group and return at once (:meth:`ready` waits for it):
        a caller can do other work while the engine loads."""
        self._token = None
        if self.spec.dev_mode:
            self._token = self._fixed_token or secrets.token_urlsafe(32)
            register_secret(self._token)  # masked wherever webloop writes or logs text
        argv, env = command(self.spec, self._token)
        self._t0 = time.monotonic()
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a")  # noqa: SIM115 - lives as long as the server
        out = self._log if self._log is not None else subprocess.DEVNULL
        # its own process group (stop() signals all of it), and SIGTERM from the kernel when
        # this process dies however it died (SIGKILL included): no engine outlives its owner
        self.proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=die_with_parent if self.die_with_starter else None,
        )
        return self

    def ready(self, timeout_s: float = 300) -> ModelServer:
        """Wait until the launched engine is healthy; stops it on failure or timeout."""
        try:
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - self._t0
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.spec.host}:{self.spec.port}/health"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise ServerError(f"the {self.spec.engine} server exited: {self.log_tail()}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise ServerError(f"the {self.spec.engine} server was not healthy in {timeout_s:.0f} s")

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log; pass log= to see it)"
        return self.log_path.read_text(errors="replace")[-chars:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 30) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL for whatever is left after
        ``grace_s``. Returns once no process of the group is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid, self.proc):
            time.sleep(0.1)
        if _group_alive(pgid, self.proc):
            _signal_group(pgid, signal.SIGKILL)
            while _group_alive(pgid, self.proc):
                time.sleep(0.1)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self, model: str | None = None, timeout_s: float = 300) -> float:
        """Serve ``model`` (default: the same folder again, re-read from disk) in place of the
        current checkpoint, under the same name and port; the seconds it took until healthy."""
        t0 = time.monotonic()
        self.stop()
        if model is not None:
            self.spec = replace(self.spec, model=model)
        self.start(timeout_s)
        return time.monotonic() - t0

    def reload_headers(self) -> dict[str, str]:
        """The ``Authorization`` header of this launch's dev endpoints (ServerError when the
        server is not running in dev mode)."""
        if self._token is None:
            raise ServerError("in-place weight reload needs the server running in dev mode")
        return {"Authorization": f"Bearer {self._token}"}

    def reload_weights(self, path: str, timeout_s: float = 600) -> float:
        """Load the weights of checkpoint folder ``path`` (same architecture, inside the spec's
        ``reload_root``) into the running engine (vLLM: and drop its caches, computed with the
        old weights); the seconds it took. ServerError when the engine cannot (no dev mode, a
        path outside the root, a failure)."""
        if not self.spec.dev_mode:
            raise ServerError("in-place weight reload needs the server in dev mode")
        root, auth = f"http://{self.spec.host}:{self.spec.port}", self.reload_headers()
        t0 = time.monotonic()
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(Path(path).absolute())}}
        _post(f"{root}/collective_rpc", body, timeout_s, auth)
        if self.spec.engine == "hf":  # webloop's engine keeps no caches across requests
            self.spec = replace(self.spec, model=str(path))
            return time.monotonic() - t0
        # everything computed with the old weights goes: the multimodal input caches of the
        # front end and the engine (the worker's alone would desync them: "cache miss"), the
        # vision encoder outputs (scheduler and worker) and the KV prefix cache
        _post(f"{root}/reset_mm_cache", {}, timeout_s, auth)
        _post(f"{root}/reset_encoder_cache", {}, timeout_s, auth)
        for _ in range(50):  # fails while blocks are held by running requests: retry
            if _post(f"{root}/reset_prefix_cache", {}, timeout_s, auth).get("success", True):
                break
            time.sleep(0.2)
        else:
            raise ServerError("weight reload: the prefix cache could not be reset (busy)")
        self.spec = replace(self.spec, model=str(path))
        return time.monotonic() - t0

    def sync_weights(self, path: str, timeout_s: float = 600) -> tuple[str, float]:
        """Serve checkpoint ``path`` from now on: in place where the engine can
        (:meth:`reload_weights`), else by :meth:`restart`; (how, seconds)."""
        if self.spec.dev_mode:
            try:
                return "reload", self.reload_weights(path, timeout_s)
            except ServerError:
                if not self.alive():
                    raise
        return "restart", self.restart(path, timeout_s)

    def __enter__(self) -> ModelServer:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _post(url: str, payload: Any, timeout_s: float, headers: dict[str, str]) -> dict[str, Any]:
    """POST for the weight reload; its JSON body ({} when none); ServerError on failure."""
    try:
        r = httpx.post(url, json=payload, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ServerError(f"weight reload: {url} failed: {exc}") from exc
    if r.status_code != 200:
        raise ServerError(f"weight reload: {url} answered {r.status_code}: {r.text[:300]}")
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int, leader: subprocess.Popen) -> bool:
    leader.poll()  # reap the leader when it has exited, or it stays a zombie in the group
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid`` (Linux ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def supervise(
    spec: ServerSpec,
    log: str | Path | None = None,
    echo: Any = print,
    timeout_s: float = 300,
    token: str | None = None,
) -> int:
    """Run ``spec``'s server in the foreground until Ctrl-C or SIGTERM (then stop its process
    group) or until the engine dies; the exit status (0 after a requested stop). ``token``: the
    dev endpoints' bearer token (see :class:`ModelServer`)."""
    server = ModelServer(spec, log, token=token)
    stopping: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start(timeout_s)
        echo(f"serving {spec.served_name} ({spec.engine}), ready in {server.started_s:.1f} s")
        echo(f"base URL: {server.base_url}")
        if spec.dev_mode:
            echo(f"dev mode: POST {server.base_url.removesuffix('/v1')}/collective_rpc reloads")
        echo("Ctrl-C stops")
        while server.alive():
            time.sleep(0.5)
        echo(f"the {spec.engine} server exited: {server.log_tail(1000)}")
        return 1
    except KeyboardInterrupt:
        echo("stopping the server …")
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        server.stop()
