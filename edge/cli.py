"""`ortserve serve`: run the edge daemon; `ortserve reload` and `ortserve rollback`: switch
its model (blue/green) on a board.

This module is loaded by every `ortserve` command (entry-point discovery), also where
the `edge` extra is not installed: it imports only the standard library at the top.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `serve`, `reload` and `rollback` subcommands to ortserve's CLI."""
    from core.cli import MODEL_OR_FOLDER, DefaultsFormatter

    parser = subparsers.add_parser(
        "serve",
        help="serve a baked model over HTTP (the edge daemon; systemd Type=notify aware)",
        description=(
            "Serve the native and OpenAI-compatible HTTP API, /healthz, /readyz and "
            "/metrics. Other settings come from ORTSERVE_* environment variables."
        ),
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(  # completes stored names and folders (shtab's `complete`)
        "model", nargs="?", metavar="MODEL",
        help="a name from `ortserve list` (served under that name), or a baked model folder; "
        "as --model-dir",
    ).complete = MODEL_OR_FOLDER  # type: ignore[attr-defined]  # fmt: skip
    parser.add_argument(
        "--model-dir", type=Path,
        help="baked model folder, or a name from `ortserve list` (ORTSERVE_MODEL_DIR)",
    ).complete = MODEL_OR_FOLDER  # type: ignore[attr-defined]  # fmt: skip
    parser.add_argument(
        "--wait-for-model", action="store_true", default=None,
        help="when the model cannot load, keep listening (503 and why) until a reload "
        "loads one, instead of exiting 1 (ORTSERVE_WAIT_FOR_MODEL; the systemd unit sets it)",
    )  # fmt: skip
    add_listen_args(parser)
    parser.set_defaults(func=run)
    _register_switch(subparsers, DefaultsFormatter)


def _register_switch(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
) -> None:
    from edge.switch import ENV_FILE, STATE_DIR, UNIT

    for name, summary in (
        ("rollback", "switch the edge daemon back to the previous model folder (blue/green, "
                     "no request lost) and wait until it serves it"),
        ("reload", "make the edge daemon load the model `current` names now (blue/green) "
                   "and wait until it serves it"),
    ):  # fmt: skip
        parser = subparsers.add_parser(
            name,
            help=summary,
            description=(
                f"{summary[0].upper()}{summary[1:]}. Models live in STATE_DIR/models/<digest> "
                "with the symlinks STATE_DIR/current (served) and STATE_DIR/previous"
                + (
                    "; the two are swapped, then the daemon reloads (SIGHUP); if it cannot "
                    "load the model the links are put back and it keeps serving."
                    if name == "rollback"
                    else "."
                )
            ),
            formatter_class=formatter,
        )
        parser.add_argument("--state-dir", type=Path, default=STATE_DIR,
                            help="the folder with models/, current and previous")  # fmt: skip
        parser.add_argument(
            "--url",
            help=f"the daemon's address (default: from ORTSERVE_HOST/PORT in {ENV_FILE}, "
            "else http://127.0.0.1:8000)",
        )
        parser.add_argument("--env-file", type=Path, default=ENV_FILE, help=argparse.SUPPRESS)
        parser.add_argument(
            "--pid", type=int, help="signal this daemon process (default: systemctl reload)"
        )
        parser.add_argument("--unit", default=UNIT, help="the systemd unit to reload")
        if name == "rollback":
            parser.add_argument(
                "--no-reload", action="store_true",
                help="only swap the links (the daemon serves them from its next start)",
            )  # fmt: skip
        parser.add_argument("--timeout", type=float, default=120.0,
                            help="seconds to wait for the daemon to serve the model")  # fmt: skip
        parser.set_defaults(func=run_switch, rollback=name == "rollback")


def run_switch(args: argparse.Namespace) -> int:
    """`ortserve rollback` / `ortserve reload`: 0 once the daemon serves the model."""
    from edge.switch import SwitchError, listen_url, switch

    command = "rollback" if args.rollback else "reload"
    url = args.url or listen_url(args.env_file)
    reload = not getattr(args, "no_reload", False)
    try:
        outcome = switch(args.state_dir, url, rollback=args.rollback, pid=args.pid,
                         unit=args.unit, reload=reload, timeout=args.timeout)  # fmt: skip
    except SwitchError as exc:
        print(f"ortserve {command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. not allowed to change the links: run it as root
        print(f"ortserve {command}: error: {exc}", file=sys.stderr)
        return 1
    if outcome.digest is None:
        print(f"ortserve {command}: {args.state_dir}/current now names the previous model; "
              "the daemon serves it from its next start or reload")  # fmt: skip
    else:
        what = "rolled back to" if args.rollback else "serving"
        print(f"ortserve {command}: {what} {outcome.model} ({outcome.digest[:12]}) "
              f"{outcome.seconds:.2f} s after the switch began")  # fmt: skip
    return 0


def port_problem(host: str | None, port: int | None, option: str = "--port ") -> str | None:
    """Why the daemon could not listen on host:port (ORTSERVE_HOST/PORT where None), with a
    free port to use instead (`option` + number: `--port 8001`, `PORT=8001`); None when it
    can. Checked before a bake, so a busy port does not waste one (`ortserve run`,
    `make demo`)."""
    if host is None or port is None:
        from pydantic import ValidationError

        from edge.settings import EdgeSettings

        try:
            settings = EdgeSettings()
        except ValidationError:  # `serve` says what is wrong; nothing to check here
            return None
        host, port = host or settings.host, settings.port if port is None else port
    try:
        _bind(host, port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        why = f"cannot listen on {host} port {port}: {reason}"
        for other in range(port + 1, min(port + 50, 65536)):
            try:
                _bind(host, other)
            except OSError:
                continue
            return f"{why}; port {other} is free: {option}{other}"
        return why
    return None


def _bind(host: str, port: int) -> None:
    """Bind host:port as the daemon does (edge.daemon._listen), then let it go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socket.create_server((host, port), family=family).close()


def add_listen_args(parser: argparse.ArgumentParser) -> None:
    """--host, --port, --alias and --log-format (shared with `ortserve run`)."""
    parser.add_argument("--host", help="address to listen on (ORTSERVE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (ORTSERVE_PORT, default 8000)")
    parser.add_argument(
        "--log-format", choices=("auto", "json", "text"),
        help="each request as a line in words on stderr (text) or a JSON record on stdout "
        "(json); auto: text at a terminal (ORTSERVE_LOG_FORMAT, default auto)",
    )  # fmt: skip
    parser.add_argument(
        "--alias", action="append", metavar="NAME",
        help="serve the model under this name (repeatable; the first is its id in /v1/models "
        "and answers; ORTSERVE_ALIASES, comma-separated), as vLLM's --served-model-name",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; exit code 0 after a graceful drain (130 when
    stopped by SIGINT), 1 when it cannot start (edge extra missing, invalid settings, port
    in use, a model that cannot load unless it waits for one)."""
    try:
        from edge.daemon import serve
    except ImportError as exc:  # uvicorn or prometheus-client: the `edge` extra
        print(f"ortserve serve: error: {exc}; install ortserve[edge]", file=sys.stderr)
        return 1
    from pydantic import ValidationError

    from core.store import with_model
    from edge.settings import EdgeSettings

    name = getattr(args, "command", "serve")  # serve.py of the Cloud Run image passes none
    command = f"ortserve {name}"
    model = getattr(args, "model", None)
    if name == "serve" and model is not None:
        if args.model_dir is not None:
            print(f"{command}: error: give MODEL or --model-dir, not both", file=sys.stderr)
            return 2
        args.model_dir = Path(model)
    overrides = {
        name: value
        for name in ("model_dir", "host", "port", "wait_for_model", "served_name", "log_format")
        if (value := getattr(args, name, None)) is not None
    }
    if getattr(args, "alias", None):
        overrides["aliases"] = args.alias
    try:
        settings = EdgeSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        print(f"{command}: error: invalid settings: {problems}", file=sys.stderr)
        return 1
    # A stored model's name (or a folder): served under the name it was started with.
    settings, located = with_model(settings)
    if located is not None and located.name and "served_name" not in settings.model_fields_set:
        settings = settings.model_copy(update={"served_name": located.name})
    return serve(settings)
