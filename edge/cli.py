"""`ortserve serve`: run the edge daemon.

This module is loaded by every `ortserve` command (entry-point discovery), also where
the `edge` extra is not installed: it imports only the standard library at the top.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `serve` subcommand to ortserve's CLI."""
    from core.cli import DefaultsFormatter

    parser = subparsers.add_parser(
        "serve",
        help="serve a baked model over HTTP (the edge daemon; systemd Type=notify aware)",
        description=(
            "Serve the native and OpenAI-compatible HTTP API, /healthz, /readyz and "
            "/metrics. Other settings come from ORTSERVE_* environment variables."
        ),
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--model-dir", type=Path,
        help="baked model folder, or a name from `ortserve list` (ORTSERVE_MODEL_DIR)",
    )  # fmt: skip
    add_listen_args(parser)
    parser.set_defaults(func=run)


def add_listen_args(parser: argparse.ArgumentParser) -> None:
    """--host and --port (shared with `ortserve run`)."""
    parser.add_argument("--host", help="address to listen on (ORTSERVE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (ORTSERVE_PORT, default 8000)")


def run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; exit code 0 after a graceful drain, 1 when it
    cannot start (edge extra missing, invalid settings, port in use)."""
    try:
        from edge.daemon import serve
    except ImportError as exc:  # uvicorn or prometheus-client: the `edge` extra
        print(f"ortserve serve: error: {exc}; install ortserve[edge]", file=sys.stderr)
        return 1
    from pydantic import ValidationError

    from core.settings import StoreSettings
    from core.store import resolve
    from edge.settings import EdgeSettings

    if getattr(args, "model_dir", None) is not None:
        args.model_dir = resolve(StoreSettings().models, args.model_dir)
    overrides = {
        name: value
        for name in ("model_dir", "host", "port")
        if (value := getattr(args, name)) is not None
    }
    try:
        settings = EdgeSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        print(f"ortserve serve: error: invalid settings: {problems}", file=sys.stderr)
        return 1
    return serve(settings)
