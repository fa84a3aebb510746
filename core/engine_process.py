"""The engine process: onnxruntime-genai in a child process of its own.

og holds Python's GIL through every prefill part and decode step, and a native fault
(SIGSEGV, SIGBUS from a weights file changed under its mapping, an allocation past the
memory ceiling) ends the process it runs in. The long-lived servers (the edge daemon,
the Cloud Run image) therefore run og here, behind the same `Model` interface as the
in-process `core.og_local.LocalModel` (vLLM's in-process and multi-process engine-core
clients): the parent keeps HTTP, the probes, tokenisation, the request policy
(core.service) and the batching rule, and drives og's generators through
`RemoteGenerator`, one call per prefill part or decode step, over a socket pair.

The child is a loop that runs one call at a time, in the order they come (og would run
them one at a time anyway, under its GIL): requests interleave part by part and step by
step, as they do in one process. When it ends for any reason but `close`, the calls in
flight fail with `EngineFaultError` (503, retry), the cause is logged and counted, and a
new child loads the model again (the folder is verified first, every byte after a
SIGBUS); a request that was running at two faults is refused from then on.

The child's side is core.engine_worker (`python -m ortserve.core.engine_worker FD`). It
is sealed: it starts with an environment of allowed names only
(`core.settings.engine_environment`: no API keys, no cloud credentials, no ORTSERVE_*
settings), gets the engine's settings only (`engine_settings`: never the server's keys),
and seals itself before it loads anything (core.engine_worker: no new privileges, no core
dumps, few file descriptors). What it sends back is decoded by an allow-list
(`receive_from_child`).
"""

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import logging
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortserve.core import errors as errors_module
from ortserve.core.errors import (
    EngineFaultError,
    InvalidRequestError,
    ModelUnavailableError,
    OrtServeError,
)
from ortserve.core.generation import Drafts, EffectiveSampling, Guidance, TokenLogprob
from ortserve.core.manifest import verify_folder
from ortserve.core.settings import EngineSettings, engine_environment

if TYPE_CHECKING:  # the parent never loads og: the child does (core.engine_worker)
    from ortserve.core.runtime import OgGenerator

log = logging.getLogger("ortserve")

# A request that was running in the engine at this many faults is refused.
FAULTS_TO_REFUSE = 2
# Loads tried after a fault before the model is given up as failed, and the pauses
# between them (a fault during the load itself: a crash loop is not retried forever).
_RESTART_PAUSES_S = (0.0, 1.0, 4.0)
# A call (a prefill part, a decode step; a whole beam search at most) still running this
# long past the request timeout has hung (a native deadlock, an endless loop): the engine
# is killed, which ends it as any fault does. Checked this often while a reply is awaited.
HUNG_AFTER_TIMEOUT_S = 30.0
_HUNG_CHECK_S = 0.5


def _cause(returncode: int) -> str:
    """How a child ended, as the restart counter's label: a signal's name, or exit N."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


@dataclass
class _Call:
    """One call's reply, once it came (or the child ended)."""

    handle: int
    sent: float = field(default_factory=time.monotonic)
    done: bool = False
    ok: bool = False
    value: Any = None


@dataclass
class _Child:
    """One engine process and its end of the socket pair."""

    proc: subprocess.Popen[bytes]
    conn: Connection
    epoch: int
    calls: dict[int, _Call] = field(default_factory=dict)  # in the order they were sent
    broken: bool = False
    stopped: bool = False  # ended on purpose: no restart
    hung: bool = False  # killed because a call hung: its cause is `hung`
    malformed: bool = False  # killed for a message it may not send: `malformed message`


class RemoteGenerator:
    """`OgGenerator` whose og Generator lives in the engine process: each call runs there."""

    def __init__(self, process: EngineProcess, handle: int, epoch: int) -> None:
        self._process = process
        self._handle = handle
        self._epoch = epoch

    def _call(self, method: str, *args: Any) -> Any:
        return self._process.call(self._epoch, self._handle, method, args)

    def append(self, input_ids: list[int] | np.ndarray[Any, Any]) -> None:
        """See `OgGenerator.append`."""
        self._call("append", input_ids)

    def step(self, top: int | None) -> tuple[int, TokenLogprob | None, Drafts | None]:
        """See `OgGenerator.step`."""
        result: tuple[int, TokenLogprob | None, Drafts | None] = self._call("step", top)
        return result

    def step_batch(self) -> list[int] | None:
        """See `OgGenerator.step_batch`."""
        result: list[int] | None = self._call("step_batch")
        return result

    def finish(self, row: int = 0) -> list[int]:
        """See `OgGenerator.finish`."""
        result: list[int] = self._call("finish", row)
        return result

    def rewind(self, length: int) -> None:
        """See `OgGenerator.rewind`."""
        self._call("rewind", length)

    def pick(self, sampling: EffectiveSampling, seed: int | None) -> None:
        """See `OgGenerator.pick`."""
        self._call("pick", sampling, seed)

    def last_logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """See `OgGenerator.last_logits`."""
        result: np.ndarray[Any, np.dtype[np.float32]] = self._call("last_logits")
        return result

    def __del__(self) -> None:
        self._process.drop(self._epoch, self._handle)


def engine_settings(settings: EngineSettings) -> EngineSettings:
    """`settings`' engine fields only, as the engine process gets them: a server's
    settings (core.settings.ServerSettings) carry its API keys, which it never needs."""
    fields = {name: getattr(settings, name) for name in EngineSettings.model_fields}
    return EngineSettings.model_construct(**fields)


class EngineProcess:
    """og's model in a child process, restarted after a fault (see the module's text).

    Attributes:
        provider: The execution provider the child's probe chose.
        skipped: Why each provider before it was skipped.
        restarts: Faults since the start, by cause (a signal's name, `exit N`).
        last_exit: The last fault's cause.
        pid: The child's process id (None while none runs).
    """

    def __init__(self, folder: Path, settings: EngineSettings, threads: int) -> None:
        self.folder = folder
        self.settings = settings
        self.threads = threads
        self.provider = ""
        self.skipped: dict[str, str] = {}
        self.restarts: collections.Counter[str] = collections.Counter()
        self.last_exit: str | None = None
        self.pid: int | None = None
        self._state = "loading"
        self._reason: str | None = None
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._reading = False
        self._child: _Child | None = None
        self._epochs = itertools.count(1)
        self._handles = itertools.count(1)
        self._calls = itertools.count(1)
        self._tags: dict[int, tuple[str, ...]] = {}
        self._faults: collections.Counter[str] = collections.Counter()
        self._drops: list[int] = []
        self._restart_callbacks: list[Callable[[], None]] = []
        self._closed = False

    @classmethod
    def start(cls, folder: Path, settings: EngineSettings, threads: int) -> EngineProcess:
        """Start the engine process and load `folder` in it (probe included).

        Raises:
            OrtServeError: The model cannot load there (as `Engine.load` says why), or
                the process ended while loading it.
        """
        process = cls(folder, settings, threads)
        process._spawn()
        return process

    # -- the Model interface --------------------------------------------------------------

    @property
    def in_process(self) -> bool:
        """No: og runs in the child."""
        return False

    @property
    def state(self) -> str:
        """See `Model.state`."""
        return self._state

    def describe(self) -> dict[str, Any]:
        """See `Model.describe`."""
        described: dict[str, Any] = {
            "process": "separate",
            "pid": self.pid,
            "state": self._state,
            "restarts": dict(self.restarts),
            "last_exit": self.last_exit,
        }
        if self._reason is not None:
            described["reason"] = self._reason
        return described

    def on_restart(self, callback: Callable[[], None]) -> None:
        """See `Model.on_restart` (called as soon as a fault is seen)."""
        self._restart_callbacks.append(callback)

    def refused(self, tag: str) -> bool:
        """Whether the request `tag` names was running in the engine at
        `FAULTS_TO_REFUSE` faults (it is not run again)."""
        with self._cond:
            return self._faults[tag] >= FAULTS_TO_REFUSE

    def generator(
        self,
        search: dict[str, Any],
        guidance: Guidance | None,
        tags: tuple[str, ...] = (),
        *,
        adapter: str | None = None,
        speculative: dict[str, Any] | None = None,
    ) -> OgGenerator:
        """See `Model.generator`: a request that comes while the engine restarts waits
        for it (up to QUEUE_TIMEOUT_S)."""
        child = self._ready(self.settings.queue_timeout_s)
        handle = next(self._handles)
        with self._cond:
            self._tags[handle] = tags
        steps = RemoteGenerator(self, handle, child.epoch)
        self.call(child.epoch, handle, "open", (search, guidance, adapter, speculative))
        return steps

    def load_adapter(self, name: str) -> bool:
        """See `Model.load_adapter` (in the engine process; a restarted one has none
        loaded: requests load theirs again)."""
        return bool(self._adapters("load_adapter", name))

    def unload_adapter(self, name: str) -> bool:
        """See `Model.unload_adapter` (in the engine process)."""
        return bool(self._adapters("unload_adapter", name))

    def loaded_adapters(self) -> list[str]:
        """See `Model.loaded_adapters` (in the engine process)."""
        names = self._adapters("loaded_adapters")  # plain data (the allow-list), of any shape
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def _adapters(self, method: str, *args: str) -> Any:
        """One call of `core.engine_worker.ADAPTER_METHODS` in the engine process (on its
        adapters: no generator's handle)."""
        child = self._ready(self.settings.queue_timeout_s)
        return self.call(child.epoch, 0, method, args)

    def close(self) -> None:
        """End the engine process (no restart follows)."""
        with self._cond:
            self._closed = True
            child, self._child = self._child, None
            self._state, self._reason = "failed", "closed"
            self._cond.notify_all()
        if child is not None:
            _stop(child)
            self._broken(child)  # calls still in flight fail; the socket is closed

    # -- calls ----------------------------------------------------------------------------

    def call(self, epoch: int, handle: int, method: str, args: tuple[Any, ...]) -> Any:
        """Run `method` of generator `handle` in the engine process; its result.

        Raises:
            RuntimeError: og's error there.
            EngineFaultError: The process ended meanwhile (or since the generator was
                made: it is gone).
        """
        with self._cond:
            child = self._child
            if child is None or child.epoch != epoch or child.broken:
                raise EngineFaultError(self._gone())
        slot = _Call(handle)
        try:
            with self._send_lock:
                call_id = next(self._calls)
                with self._cond:
                    if child.broken:
                        raise EngineFaultError(self._gone())
                    child.calls[call_id] = slot
                    drops, self._drops = self._drops, []
                send(child.conn, (call_id, handle, method, args, drops))
        except OSError:
            self._broken(child)
        self._await(child, slot)
        if slot.ok:
            return slot.value
        raise slot.value

    def _await(self, child: _Child, slot: _Call) -> None:
        """Wait for `slot`'s reply: one waiting thread at a time reads the socket and
        hands each reply to its caller (no reader thread: a reply to the reader itself,
        the usual case, costs no thread switch)."""
        with self._cond:
            while not slot.done:
                if self._reading or child.broken:
                    self._cond.wait()
                    continue
                self._reading = True
                self._cond.release()
                try:
                    while not child.conn.poll(_HUNG_CHECK_S):
                        self._kill_if_hung(child)
                    reply = reply_of(receive_from_child(child.conn))
                except MalformedMessageError as exc:
                    self._kill_malformed(child, exc)
                    reply = None
                except (EOFError, OSError):
                    reply = None
                finally:
                    self._cond.acquire()
                    self._reading = False
                if reply is None:
                    self._cond.release()
                    try:
                        self._broken(child)
                    finally:
                        self._cond.acquire()
                else:
                    call_id, ok, value = reply
                    done = child.calls.pop(call_id, None)
                    if done is not None:
                        done.ok, done.value, done.done = ok, _error(ok, value), True
                self._cond.notify_all()

    def drop(self, epoch: int, handle: int) -> None:
        """Free generator `handle` in the engine process (with the next call sent, or now
        when no call is being sent)."""
        with self._cond:
            self._tags.pop(handle, None)
            child = self._child
            if child is None or child.epoch != epoch or child.broken:
                return
            self._drops.append(handle)
        if not self._send_lock.acquire(blocking=False):
            return  # the call being sent takes it along, or the next one
        try:
            with self._cond:
                drops, self._drops = self._drops, []
            if drops:
                send(child.conn, (0, 0, "drop", (), drops))
        except OSError:
            pass  # the child is gone: so are its generators
        finally:
            self._send_lock.release()

    def _kill_if_hung(self, child: _Child) -> None:
        """Kill `child` when its oldest call in flight has run past the request timeout by
        `HUNG_AFTER_TIMEOUT_S` (its socket then closes, and the calls fail as for any
        fault)."""
        with self._cond:
            running = next(iter(child.calls.values()), None)
        limit = self.settings.request_timeout_s + HUNG_AFTER_TIMEOUT_S
        if running is None or child.hung or time.monotonic() - running.sent < limit:
            return
        child.hung = True
        log.error(
            "the engine process (pid %d) has been in one call for %.0f s: killing it",
            child.proc.pid,
            time.monotonic() - running.sent,
        )
        with contextlib.suppress(OSError):
            child.proc.kill()

    def _kill_malformed(self, child: _Child, error: MalformedMessageError) -> None:
        """Kill `child`, which sent a message it may not send (a fault: its calls fail, and
        a new child loads the model). Nothing of the message was built but allowed data."""
        child.malformed = True
        log.error("the engine process (pid %d) %s: killing it", child.proc.pid, error)
        with contextlib.suppress(OSError):
            child.proc.kill()

    # -- the child's life ---------------------------------------------------------------

    def _gone(self) -> str:
        cause = f" ({self.last_exit})" if self.last_exit else ""
        return f"the engine process ended{cause}; it is restarting: retry"

    def _ready(self, wait_s: float) -> _Child:
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._state != "ready" and not self._closed:
                if self._state == "failed":
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            child = self._child
            if self._state == "ready" and child is not None:
                return child
            if self._closed:  # a reload replaced this model after the request took it
                raise EngineFaultError("the model this request was for was unloaded: retry")
            if self._state == "failed":
                error = ModelUnavailableError(
                    f"the engine process cannot serve the model ({self._reason})"
                )
                error.retryable = False
                raise error
            raise EngineFaultError(self._gone())

    def _spawn(self) -> None:
        """Start a child, load the model in it and wait until it is ready."""
        parent_end, child_end = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ortserve.core.engine_worker", str(child_end.fileno())],
                pass_fds=(child_end.fileno(),),
                env=engine_environment(),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is the parent's to handle
            )
        finally:
            child_end.close()
        conn = Connection(parent_end.detach())
        try:
            send(
                conn, (PROTOCOL_VERSION, self.folder, engine_settings(self.settings), self.threads)
            )
            kind, *rest = loaded_of(receive_from_child(conn))
        except MalformedMessageError as exc:
            conn.close()
            proc.kill()
            proc.wait()
            raise ModelUnavailableError(f"the engine process {exc}") from None
        except (EOFError, OSError):
            conn.close()
            returncode = proc.wait()
            raise ModelUnavailableError(
                f"the engine process ended while loading the model ({_cause(returncode)})"
            ) from None
        if kind == "failed":
            conn.close()
            proc.wait()
            error: OrtServeError = rest[0]
            raise error
        self.provider, self.skipped = rest[0], rest[1]
        child = _Child(proc, conn, next(self._epochs))
        weakref.finalize(self, _stop, child)  # a forgotten engine's child ends with it
        with self._cond:
            self._child, self.pid = child, proc.pid
            self._state, self._reason = "ready", None
            self._cond.notify_all()
        watcher = threading.Thread(
            target=_watch, args=(weakref.ref(self), child), name="engine-watch", daemon=True
        )
        watcher.start()

    def _broken(self, child: _Child) -> None:
        """The child's socket closed: it ended. Fail every call in flight (the oldest was
        running: its requests are the suspects) and say why."""
        returncode = child.proc.poll()
        if returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                returncode = child.proc.wait(2.0)
        cause = _cause(returncode) if returncode is not None else "its socket closed"
        cause = "hung" if child.hung else "malformed message" if child.malformed else cause
        with self._cond:
            if child.broken:
                return
            child.broken = True
            if not self._closed:
                self.last_exit = cause
            running = next(iter(child.calls.values()), None)
            if running is not None and not self._closed:
                for tag in self._tags.get(running.handle, ()):
                    self._faults[tag] += 1
            for slot in child.calls.values():
                slot.ok, slot.done = False, True
                slot.value = EngineFaultError(
                    f"the engine process ended ({cause}) during this generation; retry"
                )
            child.calls.clear()
            if self._child is child and not self._closed:
                self._state = "restarting"
            self._cond.notify_all()
        with self._send_lock:  # nothing is sent or read on it any more: close it
            child.conn.close()
        if not self._closed:
            for callback in self._restart_callbacks:  # e.g. the prompt cache's generators
                callback()

    def _restart(self, child: _Child) -> None:
        """After `child` ended by itself: count it, then load the model in a new child."""
        returncode = child.proc.wait()
        cause = "hung" if child.hung else _cause(returncode)
        cause = "malformed message" if child.malformed else cause
        self._broken(child)
        with self._cond:
            if self._closed or child.stopped or self._child is not child:
                return
            self.restarts[cause] += 1
            self.last_exit = cause
            self._child, self.pid, self._state = None, None, "restarting"
        child.conn.close()
        log.error(
            "the engine process (pid %d) ended: %s; restarting it (restart %d)",
            child.proc.pid,
            cause,
            sum(self.restarts.values()),
        )
        # A weights file changed under its mapping gives SIGBUS: check every byte then.
        full = self.settings.verify_sha256 or cause == "SIGBUS"
        reason = ""
        for pause in _RESTART_PAUSES_S:
            time.sleep(pause)
            if self._closed:
                return
            try:
                verify_folder(self.folder, full_hash=full)
                self._spawn()
            except OrtServeError as exc:
                reason = exc.message
                log.error("the engine could not load the model again: %s", reason)
                if isinstance(exc, ModelUnavailableError) and "ended while loading" in reason:
                    continue  # a fault during the load: try again, a few times
                break
            log.info("the engine process is back (pid %d)", self.pid or 0)
            return
        with self._cond:
            self._state, self._reason = "failed", reason
            self._cond.notify_all()


def _watch(ref: weakref.ref[EngineProcess], child: _Child) -> None:
    """Wait for `child` to end; restart it unless its engine was closed (a weak
    reference: a forgotten engine is freed, and its child ends with it)."""
    child.proc.wait()
    process = ref()
    if process is not None:
        process._restart(child)


def _stop(child: _Child) -> None:
    """End a child: its socket closes (it exits at its next read), then it is killed if
    it has not exited within a few seconds (a long call under way)."""
    child.stopped = True
    # A shutdown, not a close: a thread blocked reading the socket wakes with EOF (and the
    # calls in flight fail, `_broken`, which closes it), and the child reads EOF and ends.
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=child.conn.fileno())
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()
    try:
        child.proc.wait(5.0)
    except subprocess.TimeoutExpired:
        child.proc.kill()
        child.proc.wait()


def send(conn: Connection, message: Any) -> None:
    """Send one message to the other end of the socket pair."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """The next message from the parent (the engine process's side): the daemon that
    started this process, which no one else can reach, is trusted."""
    return pickle.loads(conn.recv_bytes())  # noqa: S301 (see above)


class MalformedMessageError(OSError):
    """A message from the engine process that it may not send: not a decodable message of
    allowed types, or not the shape of a reply. The child is a fault (killed)."""


# The version of the messages between the daemon and its engine process (the handshake
# carries it; both ends are one install, so a mismatch is a broken one). 2: a generator
# opens with its adapter and speculative options as arguments; typed adapter calls.
PROTOCOL_VERSION = 2

# What the daemon builds from a message of its engine process besides plain data (tuples,
# lists, dicts, sets, str, bytes, int, float, bool, None): these classes only, and
# core.errors' own errors (a load that failed). A child compromised through native code on
# hostile input (a grammar, a prompt) can send bytes, not code: pickle's REDUCE of
# anything else (os.system, eval, subprocess) is refused before it is looked up.
_FROM_CHILD: frozenset[tuple[str, str]] = frozenset(
    {
        ("ortserve.core.generation", "TokenLogprob"),
        ("ortserve.core.generation", "Drafts"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
    }
)


class _ChildUnpickler(pickle.Unpickler):
    """pickle that builds only `_FROM_CHILD`'s classes and core.errors' errors."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FROM_CHILD:
            return super().find_class(module, name)
        if module == "ortserve.core.errors":
            found = getattr(errors_module, name, None)
            if isinstance(found, type) and issubclass(found, OrtServeError):
                return found
        raise MalformedMessageError(f"sent a message with a {module}.{name} in it")


def receive_from_child(conn: Connection) -> Any:
    """The next message from the engine process, decoded with `_ChildUnpickler`.

    Raises:
        MalformedMessageError: It holds anything else, or does not decode.
        EOFError, OSError: The socket closed.
    """
    data = conn.recv_bytes()
    try:
        return _ChildUnpickler(io.BytesIO(data)).load()
    except MalformedMessageError:
        raise
    except Exception as exc:  # a message that does not decode, however it fails
        raise MalformedMessageError(f"sent a message that does not decode ({exc!r})") from exc


def reply_of(message: Any) -> tuple[int, bool, Any]:
    """`message` as a reply to a call: (call id, ok, the result or (error type, text)).

    Raises:
        MalformedMessageError: It is not one.
    """
    if isinstance(message, tuple) and len(message) == 3:
        call_id, ok, value = message
        if type(call_id) is int and type(ok) is bool:
            failed = isinstance(value, tuple) and len(value) == 2
            if ok or (failed and all(isinstance(part, str) for part in value)):
                return call_id, ok, value
    raise MalformedMessageError(f"sent a message that is no reply: {message!r:.200}")


def loaded_of(message: Any) -> tuple[Any, ...]:
    """`message` as the answer to the handshake: ("ready", provider, skipped) or
    ("failed", an OrtServeError).

    Raises:
        MalformedMessageError: It is neither.
    """
    ready = (
        isinstance(message, tuple)
        and len(message) == 3
        and message[0] == "ready"
        and isinstance(message[1], str)
        and isinstance(message[2], dict)
    )
    failed = (
        isinstance(message, tuple)
        and len(message) == 2
        and message[0] == "failed"
        and isinstance(message[1], OrtServeError)
    )
    if ready or failed:
        return tuple(message)
    raise MalformedMessageError(f"answered the handshake with {message!r:.200}")


def _error(ok: bool, value: Any) -> Any:
    """A reply's value: the result, or the exception to raise in the caller."""
    if ok:
        return value
    kind, message = value
    if kind == "RuntimeError":
        return RuntimeError(message)
    if kind == "InvalidRequestError":
        return InvalidRequestError(message)
    return RuntimeError(f"{kind}: {message}")
