"""The engine process's side (see core.engine_process): load the model, then run the
parent's calls on its og generators, one at a time, until the socket closes.

Run as `python -m ortserve.core.engine_worker FD` by `core.engine_process.EngineProcess`.
"""

from __future__ import annotations

import ctypes
import resource
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from ortserve.core.engine_process import PROTOCOL_VERSION, receive, send
from ortserve.core.errors import ModelUnavailableError, OrtServeError
from ortserve.core.memory import return_freed_memory

# What the parent may call on a generator (`OgGenerator`'s methods).
_METHODS = frozenset({"append", "step", "step_batch", "finish", "rewind", "pick", "last_logits"})
# What it may call on the model's adapters (`Model`'s methods), and the `LocalAdapters`
# method that runs each.
ADAPTER_METHODS = {"load_adapter": "load", "unload_adapter": "unload", "loaded_adapters": "loaded"}


def serve_calls(conn: Connection) -> None:
    """The child's loop: load the model, then run calls until the socket closes."""
    # og loads here, after `seal` (main), not at this module's import.
    from ortserve.core.og_local import LocalAdapters, LocalGenerator, probe_providers

    version, folder, settings, threads = receive(conn)
    if version != PROTOCOL_VERSION:  # one install's two ends: a broken install
        message = f"speaks engine protocol {PROTOCOL_VERSION}, the daemon {version}"
        send(conn, ("failed", ModelUnavailableError(f"the engine process {message}")))
        return
    if settings.engine_memory_mb:  # a runaway allocation ends this process, not the server
        limit = settings.engine_memory_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return_freed_memory()  # before the model's buffers exist (core.memory)
    try:
        model, provider, skipped = probe_providers(folder, settings, threads, dedicated=True)
    except OrtServeError as exc:
        send(conn, ("failed", exc))
        return
    send(conn, ("ready", provider, skipped))
    adapters = LocalAdapters(model, folder)
    generators: dict[int, LocalGenerator] = {}
    while True:
        try:
            call_id, handle, method, args, drops = receive(conn)
        except (EOFError, OSError):
            return
        for dropped in drops:
            generators.pop(dropped, None)
        if method == "drop":
            continue
        try:
            if method == "open":
                search, guidance, adapter, speculative = args
                generators[handle] = LocalGenerator(
                    model, search, guidance, adapters, adapter=adapter, speculative=speculative
                )
                result: Any = None
            elif method in ADAPTER_METHODS:
                result = getattr(adapters, ADAPTER_METHODS[method])(*args)
            elif method in _METHODS:
                result = getattr(generators[handle], method)(*args)
            else:
                raise RuntimeError(f"unknown call {method}")
            reply = (call_id, True, result)
        except Exception as exc:  # the caller's to raise (og's errors are RuntimeError)
            reply = (call_id, False, (type(exc).__name__, str(exc)))
        send(conn, reply)


#: The most file descriptors the engine process may open: the model's files, its adapters,
#: Python's imports; its socket to the parent is open already.
OPEN_FILES = 256
_PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>


def seal() -> None:
    """What this process may do, narrowed before it loads anything: it can gain no
    privileges (PR_SET_NO_NEW_PRIVS: a setuid or file-capability program it ran would
    not elevate), leaves no core dump (one would hold prompts and weights), and opens at
    most OPEN_FILES files."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, limit), limit))


def main(argv: list[str]) -> int:
    """`python -m ortserve.core.engine_worker FD`: serve calls on the socket FD."""
    # The parent handles stop signals and drains; this process ends when its socket
    # closes (systemd's stop sends SIGTERM to every process of the unit). No
    # PR_SET_PDEATHSIG: it fires when the parent's *thread* that started this process
    # ends, and restarts start it from a thread that ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seal()
    conn = Connection(int(argv[1]))
    try:
        serve_calls(conn)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: so is the work
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
