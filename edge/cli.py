"""`ortserve serve`: run the edge daemon; `ortserve reload` and `ortserve rollback`: switch
its model (blue/green) on a board.

The front (ortserve.cli) registers these with every `ortserve` command, also where the
`edge` extra is not installed: this module imports only the standard library at the top.
Cloud Run's image runs `run` itself (its serve.py), without the front.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ortserve.core.settings_args import add_setting_argument
from ortserve.edge.settings import EdgeSettings


class Located(Protocol):
    """What a model name was found to be (the front's store: ortserve.store.Located)."""

    @property
    def name(self) -> str | None: ...


# The front's ortserve.store.with_model: the settings with a stored model's folder.
Locate = Callable[[EdgeSettings], "tuple[EdgeSettings, Located | None]"]


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
    model_completion: object,
    locate: Locate | None = None,
) -> None:
    """Add the `serve`, `reload` and `rollback` subcommands to ortserve's CLI (the front,
    ortserve.cli, passes its help formatter, the shell completion of a model, and how to
    find a stored model by its name)."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a baked model over HTTP (the edge daemon; systemd Type=notify aware)",
        description=(
            "Serve the native and OpenAI-compatible HTTP API, /healthz, /readyz and "
            "/metrics. Other settings come from ORTSERVE_* environment variables."
        ),
        formatter_class=formatter,
    )
    parser.add_argument(  # completes stored names and folders (shtab's `complete`)
        "model",
        nargs="?",
        metavar="MODEL",
        help="a name from `ortserve list` (served under that name), or a baked model folder; "
        "as --model-dir",
    ).complete = model_completion  # type: ignore[attr-defined]
    add_setting_argument(
        parser,
        EdgeSettings,
        "model_dir",
        help="baked model folder, or a name from `ortserve list` (ORTSERVE_MODEL_DIR)",
        type=Path,  # a stored model's name too: the front locates it
    ).complete = model_completion  # type: ignore[attr-defined]
    add_setting_argument(parser, EdgeSettings, "wait_for_model")
    add_listen_args(parser)
    parser.set_defaults(func=functools.partial(run, locate=locate))
    _register_switch(subparsers, formatter)


def _register_switch(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
) -> None:
    from ortserve.edge.switch import ENV_FILE, STATE_DIR, UNIT

    for name, summary in (
        (
            "rollback",
            "switch the edge daemon back to the previous model folder (blue/green, "
            "no request lost) and wait until it serves it",
        ),
        (
            "reload",
            "make the edge daemon load the model `current` names now (blue/green) "
            "and wait until it serves it",
        ),
    ):
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
        parser.add_argument(
            "--state-dir",
            type=Path,
            default=STATE_DIR,
            help="the folder with models/, current and previous",
        )
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
                "--no-reload",
                action="store_true",
                help="only swap the links (the daemon serves them from its next start)",
            )
        parser.add_argument(
            "--timeout",
            type=float,
            default=120.0,
            help="seconds to wait for the daemon to serve the model",
        )
        parser.set_defaults(func=run_switch, rollback=name == "rollback")


def run_switch(args: argparse.Namespace) -> int:
    """`ortserve rollback` / `ortserve reload`: 0 once the daemon serves the model."""
    from ortserve.edge.switch import SwitchError, listen_url, switch

    command = "rollback" if args.rollback else "reload"
    url = args.url or listen_url(args.env_file)
    reload = not getattr(args, "no_reload", False)
    try:
        outcome = switch(
            args.state_dir,
            url,
            rollback=args.rollback,
            pid=args.pid,
            unit=args.unit,
            reload=reload,
            timeout=args.timeout,
        )
    except SwitchError as exc:
        print(f"ortserve {command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. not allowed to change the links: run it as root
        print(f"ortserve {command}: error: {exc}", file=sys.stderr)
        return 1
    if outcome.digest is None:
        print(
            f"ortserve {command}: {args.state_dir}/current now names the previous model; "
            "the daemon serves it from its next start or reload"
        )
    else:
        what = "rolled back to" if args.rollback else "serving"
        print(
            f"ortserve {command}: {what} {outcome.model} ({outcome.digest[:12]}) "
            f"{outcome.seconds:.2f} s after the switch began"
        )
    return 0


def port_problem(host: str | None, port: int | None, option: str = "--port ") -> str | None:
    """Why the daemon could not listen on host:port (ORTSERVE_HOST/PORT where None), with a
    free port to use instead (`option` + number: `--port 8001`, `PORT=8001`); None when it
    can. Checked before a bake, so a busy port does not waste one (`ortserve run`,
    `make demo`)."""
    if host is None or port is None:
        from pydantic import ValidationError

        from ortserve.edge.settings import EdgeSettings

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
    """--host, --port, --alias and --log-format (shared with `ortserve run`): the settings'
    own flags (core.settings_args)."""
    add_setting_argument(parser, EdgeSettings, "host")
    add_setting_argument(parser, EdgeSettings, "port")
    add_setting_argument(parser, EdgeSettings, "log_format")
    add_setting_argument(
        parser, EdgeSettings, "aliases", "--alias", action="append", metavar="NAME"
    )


def run(args: argparse.Namespace, locate: Locate | None = None) -> int:
    """Run the daemon until SIGTERM/SIGINT; exit code 0 after a graceful drain (130 when
    stopped by SIGINT), 1 when it cannot start (edge extra missing, invalid settings, port
    in use, a model that cannot load unless it waits for one). `locate` turns a stored
    model's name into its folder (the front's store); without it the model is a folder."""
    try:
        from ortserve.edge.daemon import serve
    except ImportError as exc:  # uvicorn or prometheus-client: the `edge` extra
        print(f"ortserve serve: error: {exc}; install ortserve[edge]", file=sys.stderr)
        return 1
    from pydantic import ValidationError

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
    if getattr(args, "aliases", None):
        overrides["aliases"] = args.aliases
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
    if locate is None:
        return serve(settings)
    settings, located = locate(settings)
    if located is not None and located.name and "served_name" not in settings.model_fields_set:
        settings = settings.model_copy(update={"served_name": located.name})
    return serve(settings)
