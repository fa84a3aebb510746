"""The model builder's progress: its output, read while it runs, as the phase it is in,
layers (or tensors) done of the total, a percentage and an estimate of the time left.

onnxruntime-genai 0.18's builder (`python -m onnxruntime_genai.models.builder`) says:

- `Loading weights: 40%|…| 8/21` (transformers, stderr) while it reads the checkpoint;
- `Reading layer N` (stdout) as it builds each decoder layer's graph, then `Reading final
  norm` and `Reading LM head`;
- `Saving ONNX model in …` (stdout), then quantizes the weights: the builder the bake
  runs (`bake.upstream`, one weight at a time) prints `Quantizing weight 12/197 NAME int4
  (values 3211264/1543503872)` (stdout) per weight, counted as the share of the values
  done (a weight's time is about its size: the last, the LM head, is a quarter of them at 0.5B);
  in og's own whole-model pass the k_quant and RTN quantizers print
  `\\rProgress: [###  ] 45.45%` (stdout, one step per MatMul), the default one logs
  `start to quantize /model/layers.N/…` (stderr) for each weight;
- `Saving NAME: 40%|…| 16/41 [...]` (tqdm, stderr) while the tensors are written.

The phases take different times (k_quant's quantization is most of a CPU bake's builder
time), so each has its own count and estimate. At a terminal each phase is a tqdm bar;
elsewhere (a log, CI) a plain line every `interval` seconds and one when a phase ends.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from ortserve.bake.errors import HEARTBEAT_S

# How often a plain-line report says where the builder is (as often as a heartbeat).
REPORT_S = HEARTBEAT_S

_LOADING = re.compile(r"^Loading weights:.*?\|\s*(\d+)/(\d+)\b")
_LAYER = re.compile(r"^Reading layer (\d+)\s*$")
_LAYERS_DONE = re.compile(r"^Reading (final norm|LM head)")
_SAVING_MODEL = re.compile(r"^Saving ONNX model in ")
_PERCENT = re.compile(r"^Progress: \[[# ]*\] ([\d.]+)%")
_QUANT_WEIGHT = re.compile(r"^Quantizing weight (\d+)/(\d+) .*?(?:\(values (\d+)/(\d+)\))?$")
_QUANT_LAYER = re.compile(r"start to quantize /model/layers\.(\d+)/")
_QUANT_HEAD = re.compile(r"start to quantize /lm_head/")
_SAVING = re.compile(r"^Saving .*\|\s*(\d+)/(\d+) \[")


@dataclass
class Phase:
    """One phase of the builder's work.

    Attributes:
        order: Its place in the builder's run (a line of an earlier phase is ignored).
        name: What it does, in words (`building layers`).
        unit: What `done` and `total` count (`layers`, `%`, `tensors`).
        total: How many there are; None where unknown.
        started: When it began (monotonic seconds).
        done: How many are done.
        items: What a `%` phase counts besides (`(12, 197, "weights")`: 12 of 197 done),
            said beside the share; None: nothing.
    """

    order: int
    name: str
    unit: str
    total: int | None
    started: float
    done: float = 0
    items: tuple[int, int, str] | None = None

    def line(self, now: float) -> str:
        """Where the phase is: `building layers: 12/30 layers (40%), 8 s, about 12 s left`,
        or, once done, `building layers: 30 layers in 20 s`."""
        elapsed = now - self.started
        if self.total is None:
            return f"{self.name}: {elapsed:.0f} s"
        fraction = min(1.0, self.done / self.total) if self.total else 1.0
        items = self.items
        if fraction >= 1.0:
            count = f" {self.total} {self.unit}"
            if self.unit == "%":
                count = f" {items[1]} {items[2]}" if items else ""
            return f"{self.name}:{count} done in {elapsed:.0f} s"
        count = f"{self.done:.0f}/{self.total} {self.unit} ({fraction:.0%})"
        if self.unit == "%":
            count = (
                f"{items[0]}/{items[1]} {items[2]} ({fraction:.0%} of the work)"
                if items
                else f"{fraction:.0%}"
            )
        # The rate so far says what is left; within its first second a phase has none.
        left = (
            f", about {elapsed * (1 - fraction) / fraction:.0f} s left"
            if fraction and elapsed >= 1
            else ""
        )
        return f"{self.name}: {count}, {elapsed:.0f} s{left}"


class BuilderProgress:
    """Turns the builder's output lines into progress reports on `stream` (stderr).

    `feed` may be called from two threads (the builder's stdout and stderr readers).
    """

    def __init__(
        self,
        layers: int | None,
        *,
        what: str = "the model builder",
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval: float = REPORT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Report on `stream` (None: the current `sys.stderr`).

        Args:
            layers: The checkpoint's decoder layers (`num_hidden_layers`); None: unknown.
            what: The step's name at the start of each plain line.
            stream: Where reports go.
            tty: Bars (True) or plain lines (False); None: bars when `stream` is a terminal.
            interval: Seconds between plain lines within a phase.
            clock: Monotonic seconds (tests pass their own).
        """
        self._layers = layers
        self._what = what
        self._stream = stream
        out = self._out()
        self._tty = tty if tty is not None else bool(getattr(out, "isatty", lambda: False)())
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last_report = self._started
        self._phase: Phase | None = None
        self._bar: Any = None  # a tqdm bar, at a terminal

    def _out(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    # -- what the builder says ------------------------------------------------------------

    def feed(self, line: str) -> None:
        """One line (or `\\r`-separated segment) of the builder's stdout or stderr."""
        line = line.strip()
        if not line:
            return
        with self._lock:
            self._parse(line)

    def _parse(self, line: str) -> None:
        if match := _LOADING.match(line):
            self._at(0, "loading the checkpoint", "tensors", int(match[2]), int(match[1]))
        elif match := _LAYER.match(line):
            self._at(1, "building layers", "layers", self._layers, int(match[1]) + 1)
        elif _LAYERS_DONE.match(line):
            if self._layers is not None:
                self._at(1, "building layers", "layers", self._layers, self._layers)
        elif _SAVING_MODEL.match(line):
            self._at(2, "quantizing", "%", None, 0)
        elif match := _QUANT_WEIGHT.match(line):
            self._quantized(match)
        elif match := _PERCENT.match(line):
            self._at(2, "quantizing", "%", 100, float(match[1]))
        elif match := _QUANT_LAYER.search(line):
            self._at(2, "quantizing", "layers", self._layers, int(match[1]))
        elif _QUANT_HEAD.search(line):
            if self._layers is not None:
                self._at(2, "quantizing", "layers", self._layers, self._layers)
        elif match := _SAVING.match(line):
            self._at(3, "saving tensors", "tensors", int(match[2]), int(match[1]))

    def _quantized(self, match: re.Match[str]) -> None:
        """A `Quantizing weight` line: the share of the values done where it says (a big
        weight takes long), else of the weights."""
        if match[4]:
            self._at(2, "quantizing", "%", 100, 100 * int(match[3]) / max(1, int(match[4])))
            if self._phase is not None and self._phase.order == 2:
                self._phase.items = (int(match[1]), int(match[2]), "weights")
        else:
            self._at(2, "quantizing", "weights", int(match[2]), int(match[1]))

    def _at(self, order: int, name: str, unit: str, total: int | None, done: float) -> None:
        """The builder is in phase `order`, `done` of `total`."""
        now = self._clock()
        phase = self._phase
        if phase is not None and order < phase.order:
            return  # a late line of a phase already over (stdout and stderr race)
        if phase is None or order > phase.order:
            if phase is not None and phase.total is not None:
                phase.done = phase.total  # the builder moved on: it is over (k_quant's
                # last `Progress: 100%` has no line end until after the tensors are saved)
            self._end_phase(now)
            phase = self._phase = Phase(order, name, unit, total, now)
            self._last_report = now
            if self._tty:
                self._open_bar(phase)
        if total is not None and (phase.total is None or phase.unit != unit):
            phase.total, phase.unit = total, unit  # learnt from its first counted line
            if self._bar is not None:  # a bar of the same phase, now with a total
                self._bar.leave = False
                self._bar.close()
                self._open_bar(phase)
        phase.done = max(phase.done, done)
        if self._bar is not None:
            self._bar.n = phase.done
            self._bar.refresh()

    def _open_bar(self, phase: Phase) -> None:
        from tqdm import tqdm

        fmt = None  # tqdm's own: count, percentage, bar, elapsed, time left, rate
        if phase.total is None:
            fmt = "{desc}: {elapsed}"
        elif phase.unit == "%":
            fmt = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"
        self._bar = tqdm(
            total=phase.total,
            desc=f"[bake] builder: {phase.name}",
            unit=phase.unit,
            file=self._out(),
            leave=True,
            dynamic_ncols=True,
            bar_format=fmt,
        )
        # A bar reopened once its total is known counts the phase's time from its start.
        self._bar.start_t -= self._clock() - phase.started

    def _end_phase(self, now: float) -> None:
        """Close the current phase: its bar stays, or one line says how it ended."""
        phase = self._phase
        if phase is None:
            return
        if self._bar is not None:
            if phase.total is not None:
                self._bar.n = phase.done
            self._bar.close()
            self._bar = None
        else:
            self._say(phase.line(now))

    # -- time passing ---------------------------------------------------------------------

    def beat(self) -> None:
        """Called every second or so while the builder runs: a bar's clock moves on; a
        plain line is written every `interval` seconds."""
        with self._lock:
            now = self._clock()
            if self._bar is not None:
                self._bar.refresh()
                return
            if self._tty or now - self._last_report < self._interval:
                return
            self._last_report = now
            phase = self._phase
            self._say(phase.line(now) if phase else f"starting, {now - self._started:.0f} s")

    def close(self) -> None:
        """The builder ended: the last phase's bar or line."""
        with self._lock:
            self._end_phase(self._clock())
            self._phase = None

    def _say(self, text: str) -> None:
        out = self._out()
        out.write(f"[bake] {self._what}: {text}\n")
        out.flush()
