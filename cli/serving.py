"""``webloop serve-model --engine vllm|hf --model PATH|PRESET [--port N] [--dev-mode]``:
start and supervise a model server (see :mod:`serving.supervisor`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from cli.common import ConfigError, console


def _engine(value: str) -> str:
    from serving.supervisor import ENGINES

    if value not in ENGINES:
        raise typer.BadParameter(f"unknown engine {value!r}; choose from {', '.join(ENGINES)}")
    return value


def serve_model(
    model: Annotated[
        str,
        typer.Option(
            help=(
                "Checkpoint folder, or a preset built offline: 'tiny-idefics' (a tiny random "
                "Idefics3), 'smol-idefics' (SmolLM2-135M-Instruct as its text model)."
            )
        ),
    ],
    engine: Annotated[
        str, typer.Option(help="hf (webloop's transformers server) or vllm.", callback=_engine)
    ] = "hf",
    port: Annotated[
        int, typer.Option(help="Port on 127.0.0.1 (or --host).", min=1, max=65535)
    ] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    name: Annotated[str | None, typer.Option(help="Model name clients use.")] = None,
    log: Annotated[Path | None, typer.Option(help="Write the engine's output here.")] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for health.", min=1, max=86400)
    ] = 300,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            help="vLLM: context limit (default: the model's own).", min=16, max=10_000_000
        ),
    ] = None,
    kv_cache_gib: Annotated[
        int, typer.Option(help="vLLM on CPUs: KV cache GiB.", min=1, max=1024)
    ] = 1,
    dev_mode: Annotated[
        bool,
        typer.Option(
            "--dev-mode",
            help="Serve the in-place weight reload (POST /collective_rpc): loopback only; "
            "callers send 'Authorization: Bearer $WEBLOOP_RELOAD_TOKEN' (32+ characters, set "
            "in this command's environment), Content-Type application/json, no Origin, and "
            "a weights_path inside --reload-root.",
        ),
    ] = False,
    reload_root: Annotated[
        Path | None,
        typer.Option(
            help="With --dev-mode: reloads from inside this folder only (default: the served "
            "model's parent folder)."
        ),
    ] = None,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (``/v1``) until Ctrl-C / SIGTERM,
    which stop the engine and every process it started."""
    from serving.standalone.devguard import MIN_TOKEN_CHARS, TOKEN_ENV
    from serving.supervisor import ServerError, ServerSpec, command, resolve_model, supervise

    try:
        if reload_root is not None and not dev_mode:
            raise ServerError("--reload-root needs --dev-mode")
        spec = ServerSpec(
            engine,
            resolve_model(model),
            host=host,
            port=port,
            name=name or model,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            dev_mode=dev_mode,
            reload_root=str(reload_root.absolute()) if reload_root is not None else None,
        )
        token = os.environ.get(TOKEN_ENV) if dev_mode else None
        if dev_mode and len(token or "") < MIN_TOKEN_CHARS:
            raise ServerError(
                f"--dev-mode needs the bearer token of the reload calls in ${TOKEN_ENV} "
                f"({MIN_TOKEN_CHARS}+ characters, e.g. from `python -c 'import secrets; "
                f"print(secrets.token_urlsafe(32))'`)"
            )
        command(spec)  # refuses early, e.g. when the vLLM environment is missing
        code = supervise(
            spec,
            log=log,
            echo=lambda s: console.print(s, highlight=False, soft_wrap=True),
            timeout_s=timeout,
            token=token,
        )
    except ServerError as exc:
        raise ConfigError(str(exc)) from None
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``serve-model`` to ``app``."""
    app.command("serve-model")(serve_model)
