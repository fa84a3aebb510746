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
from typing import TYPE_CHECKING, Protocol

from ortserve.core.settings import EngineSettings
from ortserve.core.settings_args import add_setting_argument
from ortserve.edge.settings import EdgeSettings

if TYPE_CHECKING:
    from pydantic import ValidationError


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
    add_model_args(parser, EdgeSettings, model_completion, "served under that name")
    parser.add_argument(  # completes stored names and folders, as MODEL
        "more_models",
        nargs="*",
        metavar="MORE",
        help="more models served beside MODEL, chat or embedding (names from `ortserve "
        "list`, or folders; ORTSERVE_MODELS): a request's `model` picks one; each loads on "
        "its first request and unloads after ORTSERVE_MODEL_KEEP_ALIVE (5m) idle, within "
        "ORTSERVE_MEMORY_BUDGET_MB",
    ).complete = model_completion  # type: ignore[attr-defined]
    add_setting_argument(parser, EdgeSettings, "wait_for_model")
    add_listen_args(parser)
    parser.set_defaults(func=functools.partial(run, locate=locate))
    _register_switch(subparsers, formatter)
    _register_local(subparsers, formatter)


def add_model_args(
    parser: argparse.ArgumentParser,
    settings: type[EngineSettings],
    completion: object,
    served: str = "",
) -> None:
    """MODEL (positional, optional) and `--model-dir`, its older spelling, as `serve`,
    `generate` and `probe` take them; `model_dir` then names the one given
    (`chosen_model`)."""
    served = f" ({served})" if served else ""
    parser.add_argument(  # completes stored names and folders (shtab's `complete`)
        "model",
        nargs="?",
        metavar="MODEL",
        help=f"a name from `ortserve list`{served}, or a baked model folder (default: "
        "ORTSERVE_MODEL_DIR, else the store's only model)",
    ).complete = completion  # type: ignore[attr-defined]
    add_setting_argument(
        parser,
        settings,
        "model_dir",
        help="as MODEL (its older spelling; ORTSERVE_MODEL_DIR)",
        type=Path,  # a stored model's name too: the front locates it
    ).complete = completion  # type: ignore[attr-defined]


def chosen_model(args: argparse.Namespace) -> str | None:
    """Put MODEL, when given, in `args.model_dir` (see `add_model_args`); why not when
    `--model-dir` was given too, else None."""
    model = getattr(args, "model", None)
    if model is None:
        return None
    if args.model_dir is not None:
        return "give MODEL or --model-dir, not both"
    args.model_dir = Path(model)
    return None


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


def _register_local(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
) -> None:
    """`ortserve ps` and `ortserve stop`: a local server (`serve`, `run`), as Ollama's."""
    ps = subparsers.add_parser(
        "ps",
        help="show what a local server (`ortserve serve`/`run`) has loaded",
        description="Ask the server on --host/--port (ORTSERVE_HOST/ORTSERVE_PORT, default "
        "127.0.0.1:8000) what it has loaded (GET /api/ps, with ORTSERVE_API_KEYS' first key "
        "if set): name, id, size, processor, context, until, as `ollama ps`. Exit 1 when "
        "no server answers there.",
        formatter_class=formatter,
    )
    _add_local_address(ps)
    ps.set_defaults(func=run_ps)
    stop = subparsers.add_parser(
        "stop",
        help="stop the local server (`ortserve serve`/`run`) on a port: a graceful drain",
        description="Send SIGTERM to the `ortserve` process listening on --host/--port "
        "(ORTSERVE_HOST/ORTSERVE_PORT, default 127.0.0.1:8000), found by its socket, and "
        "wait until it has drained its requests and exited, as `systemctl stop` does. A "
        "server run by systemd: `systemctl stop ortserve` instead (systemd would restart "
        "it). Linux only.",
        formatter_class=formatter,
    )
    _add_local_address(stop, host=False)
    stop.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to exit")
    stop.set_defaults(func=run_stop)


def _add_local_address(parser: argparse.ArgumentParser, host: bool = True) -> None:
    if host:
        parser.add_argument(
            "--host", help="the server's address (default: ORTSERVE_HOST's, else 127.0.0.1)"
        )
    parser.add_argument("--port", type=int, help="its port (default: ORTSERVE_PORT, else 8000)")


def _local_settings(args: argparse.Namespace) -> EdgeSettings:
    """The server's settings as `ps` and `stop` reach it: --host/--port over
    ORTSERVE_HOST/PORT (and ORTSERVE_API_KEYS).

    Raises:
        InvalidRequestError: An ORTSERVE_ variable's value is not one.
    """
    from pydantic import ValidationError

    from ortserve.core.errors import InvalidRequestError

    given = {"host": getattr(args, "host", None), "port": args.port}
    try:
        return EdgeSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid settings: {_problems(exc)}") from None


def run_ps(args: argparse.Namespace) -> int:
    """`ortserve ps`: the loaded model of the server on host:port, as `ollama ps` shows it;
    exit 1 when none answers (as `ollama ps` does)."""
    import json
    import urllib.error
    import urllib.request

    from ortserve.edge.switch import local_url

    settings = _local_settings(args)
    url = local_url({"ORTSERVE_HOST": settings.host, "ORTSERVE_PORT": str(settings.port)})
    where = url.removeprefix("http://")
    # local_url makes an http:// URL (no file: or custom schemes).
    request = urllib.request.Request(f"{url}/api/ps")  # noqa: S310
    if settings.api_keys:
        request.add_header("Authorization", f"Bearer {settings.api_keys[0]}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
            models = json.load(answer)["models"]
    except urllib.error.HTTPError as exc:
        hint = ": set ORTSERVE_API_KEYS to its key" if exc.code == 401 else ""
        print(f"ortserve ps: error: {where} answered {exc.code}{hint}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"ortserve ps: error: no server on {where} ({reason}): start one with "
            "`ortserve serve MODEL`, or give --host/--port",
            file=sys.stderr,
        )
        return 1
    rows = [("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")]
    for model in models:
        processor = "100% GPU" if model.get("size_vram") else "100% CPU"
        rows.append(
            (
                str(model["name"]),
                str(model.get("digest", ""))[:12],
                _size(int(model.get("size", 0))),
                processor,
                str(model.get("context_length", "-")),
                _until(str(model.get("expires_at", ""))),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("    ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _until(expires_at: str) -> str:
    """UNTIL as `ollama ps` says it: "Forever" for a model kept for good (Ollama's
    `expires_at` ~292 years away), else how long from now ("4 minutes from now")."""
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    left = (when - datetime.now(UTC)).total_seconds()
    if left > 100 * 365 * 86400:
        return "Forever"
    if left < 60:
        return "Less than a minute from now" if left > 0 else "Stopping..."
    minutes = int(left // 60)
    if minutes < 60:
        return f"{minutes} minute{'s' if minutes != 1 else ''} from now"
    hours = minutes // 60
    return f"{hours} hour{'s' if hours != 1 else ''} from now"


def _size(size: int) -> str:
    """Bytes as `ollama ps` writes them (SI units)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}"
        value /= 1000
    return f"{value:.0f} GB"


def run_stop(args: argparse.Namespace) -> int:
    """`ortserve stop`: SIGTERM to the `ortserve` process listening on host:port (found by
    its socket in /proc), then wait for it to exit; 1 when there is none, it is not an
    `ortserve` process, or it is not ours to signal."""
    import signal
    import time

    port = _local_settings(args).port
    pids = listening_pids(port)
    if pids is None:
        print(
            "ortserve stop: error: finding a server by its port needs Linux's /proc",
            file=sys.stderr,
        )
        return 1
    ours = [p for p in pids if p > 0 and _is_ortserve(p)]
    if not ours:
        if -1 in pids:
            what = "another user's process does (a board's daemon: `sudo systemctl stop ortserve`)"
        elif pids:
            what = f"process {', '.join(map(str, pids))} does, not ortserve"
        else:
            what = "nothing listens there; --port N names another"
        print(
            f"ortserve stop: error: no ortserve server of yours on port {port}: {what}",
            file=sys.stderr,
        )
        return 1
    for pid in ours:
        try:
            os.kill(pid, signal.SIGTERM)
        except PermissionError:
            print(
                f"ortserve stop: error: process {pid} on port {port} is not yours to stop: "
                "`sudo systemctl stop ortserve` (a board's daemon), or as its user",
                file=sys.stderr,
            )
            return 1
    print(f"ortserve stop: stopping process {', '.join(map(str, ours))} on port {port}")
    deadline = time.monotonic() + args.timeout
    while any(_alive(p) for p in ours):
        if time.monotonic() > deadline:
            print(f"ortserve stop: error: still running after {args.timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"ortserve stop: stopped (port {port} is free)")
    return 0


def listening_pids(port: int) -> list[int] | None:
    """The processes with a TCP socket listening on `port` (any address), from Linux's
    /proc (-1 for a socket no process of this user holds); None without /proc."""
    inodes: set[str] = set()
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not any(t.is_file() for t in tables):
        return None
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    found: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                found.add(int(proc.name))
        except OSError:  # gone, or another user's
            continue
    return sorted(found) if found or not inodes else [-1]


def _is_ortserve(pid: int) -> bool:
    """Whether process `pid` runs ortserve (its command line names it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"ortserve" in cmdline.read()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie is gone
    except OSError:
        return False


def run_switch(args: argparse.Namespace) -> int:
    """`ortserve rollback` / `ortserve reload`: 0 once the daemon serves the model."""
    from ortserve.edge.switch import SwitchError, listen_url, local_key, switch

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
            key=local_key(args.env_file),
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
    both = chosen_model(args) if name == "serve" else None
    if both is not None:
        print(f"{command}: error: {both}", file=sys.stderr)
        return 2
    overrides = {
        name: value
        for name in ("model_dir", "host", "port", "wait_for_model", "served_name", "log_format")
        if (value := getattr(args, name, None)) is not None
    }
    if getattr(args, "aliases", None):
        overrides["aliases"] = args.aliases
    if getattr(args, "more_models", None):
        overrides["models"] = list(args.more_models)
    try:
        settings = EdgeSettings(**overrides)
    except ValidationError as exc:
        print(f"{command}: error: invalid settings: {_problems(exc)}", file=sys.stderr)
        return 1
    # A stored model's name (or a folder): served under the name it was started with.
    if locate is None:
        return serve(settings)
    settings, located = locate(settings)
    if located is not None and located.name and "served_name" not in settings.model_fields_set:
        settings = settings.model_copy(update={"served_name": located.name})
    settings = _model_folders(settings, locate)
    problem = port_problem(settings.host, settings.port)
    if problem is not None:  # with a free port to use, before the daemon starts
        print(f"{command}: error: {problem}", file=sys.stderr)
        return 1
    return serve(settings)


def _model_folders(settings: EdgeSettings, locate: Locate) -> EdgeSettings:
    """`settings` with each more model's name (a stored model, or a folder) as
    `NAME=FOLDER` (`FOLDER` for a folder given as one), so that requests name it as it
    was given.

    Raises:
        ModelNotFoundError: A name no folder and no stored model has.
    """
    from ortserve.core.registry import model_entries

    entries: list[str] = []
    for given, folder in model_entries(settings):
        found, located = locate(settings.model_copy(update={"model_dir": folder}))
        name = given or (located.name if located is not None else None)
        entries.append(f"{name}={found.model_dir}" if name else str(found.model_dir))
    return settings.model_copy(update={"models": entries})


# The settings `serve` (and `run`) have a flag for; every one has its ORTSERVE_ variable.
_FLAGS = {"model_dir": "--model-dir", "host": "--host", "port": "--port"}
_FLAGS |= {"log_format": "--log-format", "aliases": "--alias"}


def _problems(exc: ValidationError) -> str:
    """What is wrong with the settings, each named as a user sets it."""
    return "; ".join(
        f"{_setting_label(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
    )


def _setting_label(loc: tuple[int | str, ...]) -> str:
    """An invalid setting's name as a user sets it: `port (--port or ORTSERVE_PORT)`."""
    field = str(loc[0]) if loc else "?"
    env = f"ORTSERVE_{field.upper()}"
    where = f"{_FLAGS[field]} or {env}" if field in _FLAGS else env
    return f"{'.'.join(str(p) for p in loc)} ({where})"
