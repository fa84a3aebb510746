"""The edge daemon's life: listen, load the model, tell systemd, drain on SIGTERM, exit 0.

1. uvicorn listens at once: /healthz answers and /readyz says 503 while the model loads.
2. The model loads in a worker thread; `READY=1` goes to systemd only once it is loaded
   and probed. A model that fails to load ends the process with exit code 1 and the
   reason (as llama-server does), unless `wait_for_model` is set (the systemd unit sets
   it): then the process stays up (/readyz: 503 and why), systemd never gets `READY=1`,
   so its start times out and `Restart=` retries, and a SIGHUP reload may load one.
3. SIGHUP (`systemctl reload`, the unit's ExecReload): a blue/green model switch.
   `RELOADING=1`, then the folder ORTSERVE_MODEL_DIR names now (the `current` symlink)
   loads beside the serving model, is verified and warmed up, and new requests switch to
   it; requests in flight finish on the old one (see `ModelState.reload`). `READY=1` when
   it ends, either way: if the new model fails the old one keeps serving, and /readyz's
   `reload` says why. Other settings are not read again (they need a restart). A SIGHUP
   during a reload queues one more (the symlink may have moved again).
4. SIGTERM (or SIGINT): `STOPPING=1`, new generations get 503, in-flight requests (streams
   included) may finish within `drain_timeout_s`; then uvicorn stops and the exit code is 0
   (130 after SIGINT, a shell's Ctrl-C convention). A second signal stops the generations
   at once: each still ends with its `shutting_down` answer (a stream's error event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn

from ortserve.core.api import Api
from ortserve.core.records import RequestRecord
from ortserve.core.state import ModelState
from ortserve.edge.asgi import EdgeApp
from ortserve.edge.connections import guarded_h11
from ortserve.edge.logs import RequestLog, configure_stderr_logging, records_as_text
from ortserve.edge.metrics import CONTENT_TYPE, Metrics
from ortserve.edge.notify import Notifier
from ortserve.edge.offload import run_in_thread
from ortserve.edge.settings import EdgeSettings
from ortserve.edge.switch import restore_link

log = logging.getLogger("ortserve.edge")

# Threads beyond the engine's slots and queue, for requests still being validated.
_SPARE_WORKERS = 4
# After the drain, how long uvicorn may take to close the connections that are left.
_CLOSE_TIMEOUT_S = 3
_POLL_S = 0.05
# After the drain timeout, how long generations get to send their shutting_down answer.
_STOP_GRACE_S = 2.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (it would stop without draining, then
    re-raise SIGTERM so the exit code is not 0); the daemon handles signals itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Daemon:
    """One serving process: the API, its ASGI app, the uvicorn server and systemd's view.

    Attributes:
        settings: The process's settings.
        state: The model's state (loading, ready, failed).
        api: The core API.
        app: The ASGI app over `api`.
        notifier: The sd_notify client (a no-op outside systemd).
    """

    def __init__(self, settings: EdgeSettings) -> None:
        """Build everything; nothing listens or loads until `run`."""
        self.settings = settings
        self.notifier = Notifier(
            settings.notify_socket, settings.watchdog_usec, settings.watchdog_pid
        )
        self.state = ModelState(settings)
        self._log = RequestLog(records_as_text(settings.log_format), sys.stdout)
        self.metrics = Metrics(self.state, in_flight=lambda: self.api.in_flight)
        self.api = Api(
            self.state,
            settings,
            on_record=self._record,
            metrics=lambda: (CONTENT_TYPE, self.metrics.render()),
        )
        workers = settings.max_concurrency + settings.max_queue + _SPARE_WORKERS
        self.app = EdgeApp(self.api, settings.max_body_bytes, workers)
        config = uvicorn.Config(
            self.app,
            host=settings.host,
            port=settings.port,
            interface="asgi3",
            # h11 with a read deadline and connection caps (edge.connections); no
            # WebSocket upgrade, which would leave that protocol.
            http=guarded_h11(
                settings.read_timeout_s, settings.max_connections, settings.max_connections_per_peer
            ),
            ws="none",
            timeout_keep_alive=settings.keep_alive_s,
            lifespan="off",
            access_log=False,  # each request is logged once, from its record (edge.logs)
            log_config=None,  # stderr logging is configured by `serve`
            timeout_graceful_shutdown=_CLOSE_TIMEOUT_S,
            server_header=False,  # same headers as the other targets; no version banner
        )
        self.server = _Server(config)
        self._signals = 0
        self._interrupted = False  # the first stop signal was SIGINT (Ctrl-C)
        self._drained = False
        self._stop: asyncio.Event | None = None
        self._reload_wanted: asyncio.Event | None = None

    def _record(self, record: RequestRecord) -> None:
        self.metrics.observe(record)
        self._log.record(record)

    def _busy(self) -> bool:
        return self.api.in_flight > 0 or self.app.in_flight > 0

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            self._interrupted = signum == signal.SIGINT
        elif self._signals == 2:  # stop without waiting, but end each answer properly
            log.warning("second stop signal: stopping %d request(s) now", self.api.in_flight)
            self.api.stop_generations()
        if self._drained:  # uvicorn is closing connections: stop waiting for them
            self.server.force_exit = True
        if self._stop is not None:
            self._stop.set()

    def _on_reload_signal(self) -> None:
        if self._signals:
            log.warning("reload signal while stopping: ignored")
        elif self._reload_wanted is not None:
            self._reload_wanted.set()

    async def _reloader(self, address: str) -> None:
        """Run the reloads SIGHUP asks for, one at a time (after the first load ended)."""
        assert self._reload_wanted is not None
        while True:
            await self._reload_wanted.wait()
            self._reload_wanted.clear()
            if self._signals:
                return
            target = self.settings.model_dir
            self.notifier.reloading(f"reloading: loading {target} beside the serving model")
            report = await run_in_thread(self.state.reload, "ortserve-reload")
            await run_in_thread(self._reload_others, "ortserve-reload")
            engine = self.state.engine
            if self.state.embedder is not None:  # an embedding model: not reloaded
                self.notifier.ready(
                    f"reload refused ({report.reason}); still serving {self.state.model_id} "
                    f"at {address}"
                )
                continue
            if engine is None:  # nothing serves (the first load failed too): not ready
                self.notifier.status(
                    f"model failed to load: {self.state.reason}; /readyz answers 503 at {address}"
                )
                continue
            if report.status == "failed":
                restored = restore_link(self.settings.model_dir, engine.settings.model_dir)
                text = (
                    f"reload failed ({report.reason}); still serving {self.state.model_id} "
                    f"({engine.digest[:12]}) at {address}"
                    + (f"; {self.settings.model_dir} points at it again" if restored else "")
                )
            else:
                text = (
                    f"serving {self.state.model_id} ({engine.digest[:12]}) on "
                    f"{engine.probe.provider} at {address} (reload {report.status}"
                    + (f" in {report.seconds:.1f} s)" if report.seconds else ")")
                )
            self.notifier.ready(text)

    def _reload_others(self) -> None:
        """Reload, blue/green, each other loaded generative model whose folder (a
        `current` symlink, say) now holds another model; the unloaded ones read their
        folder at their next load."""
        for state in self.api.registry.states[1:]:
            if state.service is None:
                continue
            report = state.reload()
            log.info(
                "reload of %s: %s%s",
                state.model_id,
                report.status,
                f" ({report.reason})" if report.reason else "",
            )

    async def run(self) -> int:
        """Serve until a stop signal, then drain; the process's exit code."""
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._reload_wanted = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        # Handled from the start: SIGHUP's default action would end the process (exit 129,
        # which systemd counts as clean, so Restart=on-failure would not bring it back).
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)
        try:
            listener = _listen(self.settings.host, self.settings.port)
        except OSError as exc:  # bound here: uvicorn would sys.exit(3) from inside a task
            log.error(
                "cannot listen on %s port %d: %s",
                self.settings.host,
                self.settings.port,
                exc.strerror or exc,
            )
            return 1
        host, port = listener.getsockname()[:2]
        address = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        watchdog = asyncio.create_task(self._watchdog())
        reloader: asyncio.Task[None] | None = None
        serving = asyncio.create_task(self.server.serve(sockets=[listener]))
        try:
            while not self.server.started and not serving.done():
                await asyncio.sleep(0.01)
            self.notifier.status(f"listening on {address}; loading {self.settings.model_dir}")
            loading = asyncio.create_task(run_in_thread(self.state.load, "ortserve-load"))
            stopping = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait(
                {loading, stopping, serving}, return_when=asyncio.FIRST_COMPLETED
            )
            if loading in done and self._cannot_serve(address):
                self.server.should_exit = True
                await serving
                return 1
            if loading in done:
                reloader = asyncio.create_task(self._reloader(address))
                await asyncio.wait({stopping, serving}, return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():
                await self._drain()
                self.server.should_exit = True
            await serving
            self.notifier.status("stopped")
            return 128 + signal.SIGINT if self._interrupted else 0
        finally:
            watchdog.cancel()
            if reloader is not None:
                reloader.cancel()  # a load under way ends in its thread; nothing uses it

    def _cannot_serve(self, address: str) -> bool:
        """Announce the first load's outcome; True when the process should exit 1 (the
        model failed to load, and `wait_for_model` is not set)."""
        engine = self.state.engine
        embedder = self.state.embedder
        if embedder is not None:
            self.notifier.ready(
                f"serving the embedding model {self.state.model_id} on onnxruntime's CPU "
                f"provider at {address} (loaded in {embedder.load_seconds:.1f} s)"
            )
            return False
        if engine is None and not self.settings.wait_for_model:
            self.notifier.status(f"model failed to load: {self.state.reason}; exiting")
            hint = _no_model_hint(self.settings)
            log.error("exiting: %s (%s)", self.state.reason, hint)
            return True
        if engine is None:
            self.notifier.status(
                f"model failed to load: {self.state.reason}; /readyz answers 503 at {address}"
            )
            return False
        probe = engine.probe
        self.notifier.ready(
            f"serving {self.state.model_id} on {probe.provider} at {address} "
            f"(loaded in {probe.load_seconds:.1f} s)"
        )
        # Where to go next, as a browser reaches it (a wildcard address is no URL).
        local = address.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")
        log.info("API at %s/v1 (OpenAI-compatible); playground at %s/", local, local)
        return False

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.settings.drain_timeout_s
        self.api.start_draining()  # before STOPPING=1: once systemd hears it, no new work
        draining = f"draining {self.api.in_flight} in-flight request(s), up to {timeout:g} s"
        self.notifier.stopping(draining)
        if self._busy():
            again = "Ctrl-C" if self._interrupted else "SIGTERM or SIGINT"
            log.info("%s… %s again to stop now", draining, again)
        deadline = loop.time() + timeout
        while self._busy() and loop.time() < deadline and self._signals < 2:
            await asyncio.sleep(_POLL_S)
        if self._busy():
            if self._signals < 2:
                log.warning(
                    "drain ended with %d request(s) in flight: stopping them", self.api.in_flight
                )
            # Each ends at its next token with a shutting_down answer (an SSE error event,
            # or a 503); only what does not end within the grace is cut off.
            self.api.stop_generations()
            grace = loop.time() + _STOP_GRACE_S
            while self._busy() and loop.time() < grace:
                await asyncio.sleep(_POLL_S)
            self.app.cancel_streams()
            self.server.force_exit = True  # what is left is cut: no wait for connections
        self._drained = True
        self.notifier.status("stopping")

    async def _watchdog(self) -> None:
        """Ping systemd's watchdog while the event loop runs (a stuck loop stops the pings)."""
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)


def _no_model_hint(settings: EdgeSettings) -> str:
    """What to do when the model did not load at start (its reason is said apart)."""
    if "model_dir" not in settings.model_fields_set:
        return (
            "no MODEL, --model-dir or ORTSERVE_MODEL_DIR given, and no stored model: "
            "`ortserve pull SOURCE` bakes one, `ortserve serve FOLDER` serves a folder"
        )
    if not settings.model_dir.exists():
        return (
            "moved or removed? `ortserve list` names the stored models (`ortserve serve "
            "NAME`); a folder moved elsewhere: give its new path"
        )
    return "--wait-for-model: wait for one instead"


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def serve(settings: EdgeSettings) -> int:
    """Run the daemon in this process until it is stopped; its exit code."""
    configure_stderr_logging(settings.log_level)
    return asyncio.run(Daemon(settings).run())
