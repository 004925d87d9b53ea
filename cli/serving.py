"""``webloop serve-model --engine vllm|hf --model PATH|tiny-idefics [--port N]``: start and
supervise a model server (see :mod:`serving.supervisor`)."""

from __future__ import annotations

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
        typer.Option(help="Checkpoint folder, or 'tiny-idefics' (a tiny offline Idefics3)."),
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
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (``/v1``) until Ctrl-C / SIGTERM,
    which stop the engine and every process it started."""
    from serving.supervisor import (
        ServerError,
        ServerSpec,
        command,
        is_loopback,
        resolve_model,
        supervise,
    )

    try:
        path = resolve_model(model)
        spec = ServerSpec(
            engine,
            path,
            host=host,
            port=port,
            name=name or model,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            dev_mode=is_loopback(host),  # in-place weight reloads: never on a public address
        )
        command(spec)  # refuses early, e.g. when the vLLM environment is missing
        code = supervise(
            spec,
            log=log,
            echo=lambda s: console.print(s, highlight=False, soft_wrap=True),
            timeout_s=timeout,
        )
    except ServerError as exc:
        raise ConfigError(str(exc)) from None
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``serve-model`` to ``app``."""
    app.command("serve-model")(serve_model)
