"""`quickdraft serve`: an OpenAI-compatible HTTP server over one speculative engine.

The server starts listening at once (GET /health answers 503 while the models load), loads the
engine on a background thread, then prints where it serves. SIGTERM or Ctrl-C stop it
gracefully: in-flight requests get `--shutdown-timeout` seconds to finish, then are cancelled, each
stream with an error event and [DONE] and each waiting request with a 503, before the connections close.
"""

import argparse
import asyncio
import functools
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.commands.arguments import add_batch_arguments, add_model_arguments, load_engine
from quickdraft.config import SpecConfig
from quickdraft.errors import ModelError, UsageError
from quickdraft.models.registry import default_drafter
from quickdraft.server.settings import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_READ_TIMEOUT,
    ServerSettings,
    allowed_hosts_for,
    is_loopback,
)

if TYPE_CHECKING:  # torch and the engine are imported when the command runs: --help and usage errors at once
    import torch

    from quickdraft.engine import Engine

STREAM_END_MARGIN = 1.0  # seconds before --shutdown-timeout runs out at which unfinished jobs are cancelled


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /metrics)."
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="NAMES",
        help="Host header names answered, any port (comma list, * for any); default: localhost, 127.0.0.1 and "
        "[::1] when --host is a loopback address (a web page cannot rebind its name to this machine), else any",
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route except /health"
    )
    keys.add_argument(
        "--api-key-file", type=Path, default=None, help="read the API key from this file (keeps it out of `ps`)"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="the model name clients send (default: the --model value)"
    )
    add_batch_arguments(parser)
    parser.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait while --max-batch run; more are answered 429 (default 16)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"output tokens when a request sets no max_tokens (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="larger request bodies are answered 413 (default 1 MiB)"
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=int,
        default=10,
        help="seconds in-flight requests get to finish on SIGTERM (default 10)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        help=f"seconds a client gets to send a whole request, headers and body; slower ones get 408 "
        f"(default {DEFAULT_READ_TIMEOUT:g})",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="uvicorn log level (default warning)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn  # imported here: the other commands need neither uvicorn nor FastAPI

    from quickdraft.models.loading import check_device
    from quickdraft.server.app import create_app, end_jobs
    from quickdraft.server.protocol import GuardedH11Protocol

    settings = server_settings(args)
    warning = exposure_warning(args.host, settings.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    SpecConfig(
        drafter=args.drafter or default_drafter(args.model), k=args.k, k_max=args.k_max
    )  # checked before listening
    check_device(args.device)
    _check_port(args.port)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        http=functools.partial(GuardedH11Protocol, read_timeout=settings.read_timeout),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.log_level in ("debug", "info"),
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    server = _server_ending_streams(config, lambda: end_jobs(app))
    failure: list[Exception] = []
    threading.Thread(
        target=_load_and_attach, args=(args, app, server, failure), name="quickdraft-loader", daemon=True
    ).start()
    signal.signal(signal.SIGTERM, _after_graceful_shutdown)
    server.run()
    if failure:
        raise (
            failure[0]
            if isinstance(failure[0], UsageError | ModelError)
            else ModelError(f"loading failed: {failure[0]}")
        )
    return 0


def _server_ending_streams(config, end_jobs: Callable[[], None]):
    """uvicorn's server, which on shutdown cancels the unfinished jobs STREAM_END_MARGIN seconds before the grace
    period runs out: every stream then ends with an event the client can read (an error, then [DONE]) instead
    of being cut off mid-text when uvicorn cancels what is left."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            grace = self.config.timeout_graceful_shutdown or 0
            asyncio.get_running_loop().call_later(max(grace - STREAM_END_MARGIN, 0.0), end_jobs)
            await super().shutdown(sockets)

    return Server(config)


def server_settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        model_name=args.served_model_name or args.model,
        api_key=_api_key(args),
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        default_max_tokens=args.max_tokens,
        allowed_hosts=allowed_hosts_for(args.host, args.allowed_hosts),
        read_timeout=args.read_timeout,
    )


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A loud line when the server will listen beyond this machine with no API key, else None."""
    if api_key is not None or is_loopback(host):
        return None
    return (
        f"quickdraft: WARNING: listening on {host} without an API key: anyone who can reach this address can "
        "run generations; pass --api-key or --api-key-file (and put TLS in front), or bind 127.0.0.1"
    )


def build_engine(args: argparse.Namespace) -> "Engine":
    """The engine for --model (built-in name, local directory, .gguf file or hub id), refused when its KV cache
    slots could outgrow the memory this machine has available."""
    engine = load_engine(args, args.max_batch, args.step_tokens)
    print(_kv_memory_line(engine), flush=True)
    return engine


def _kv_memory_line(engine: "Engine") -> str:
    """What the KV cache slots take at most; UsageError when that exceeds the memory available."""
    per_slot, slots = engine.kv_bytes_per_slot(), engine.max_batch
    context = engine.target.info.max_context
    if per_slot == 0:
        return f"quickdraft: {slots} request at a time (the transformers runtime holds one sequence)"
    device = engine.target.runner.device
    needed, available = per_slot * slots, _available_memory(device)
    line = (
        f"quickdraft: KV cache {per_slot / 2**20:.0f} MiB per slot at the full context of {context} tokens, "
        f"{slots} slots: at most {needed / 2**30:.2f} GiB (slots grow as their sequences do)"
    )
    if available is not None and needed > available:
        raise UsageError(
            f"{slots} KV cache slots need up to {needed / 2**30:.2f} GiB at the full context of {context} tokens, "
            f"but {available / 2**30:.2f} GiB of {'GPU ' if device.type == 'cuda' else ''}memory are available; "
            "lower --max-batch"
        )
    return line


def _available_memory(device: "torch.device") -> int | None:
    """Bytes free where the KV cache lives: the GPU's free memory on a GPU, else MemAvailable (Linux), or None
    where it cannot be read."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    value = fields.get("MemAvailable", "").split()
    return int(value[0]) * 1024 if value else None


def _load_and_attach(args: argparse.Namespace, app, server, failure: list[Exception]) -> None:
    """Load the engine on this thread, then serve it; a failure stops the server."""
    from quickdraft.server.app import attach_engine

    try:
        engine = build_engine(args)
    except Exception as exc:  # any failure must stop the server, or /health would stay 503 forever
        failure.append(exc)
        server.should_exit = True
        return
    attach_engine(app, engine)
    host = f"[{args.host}]" if ":" in args.host else args.host
    key_note = "; send 'Authorization: Bearer KEY'" if args.api_key or args.api_key_file else ""
    print(
        f"quickdraft: serving {app.state.quickdraft.settings.model_name} "
        f"(drafter {engine.spec.drafter}, k {engine.spec.k}, max batch {engine.max_batch}) "
        f"at http://{host}:{args.port}/v1{key_note}",
        flush=True,
    )


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is None:
        return args.api_key
    try:
        return args.api_key_file.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the API key file {args.api_key_file}: {exc.strerror}; check the path") from exc


def _check_port(port: int) -> None:
    if not 0 < port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {port}")


def _after_graceful_shutdown(signum: int, frame) -> None:
    """uvicorn re-raises SIGTERM once its graceful shutdown is done; by then exiting 0 is right."""
    print("quickdraft: stopped", file=sys.stderr, flush=True)
