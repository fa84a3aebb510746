"""`ortserve run MODEL [PROMPT]` at a terminal, as `ollama run`: one answer, or a chat.

The model loads in this process (no HTTP server): the answer streams to stdout as it is
generated. The interactive chat keeps the conversation (each turn goes through the model's
chat template with the turns before it), ends with `/bye` or Ctrl-D, and Ctrl-C stops the
answer being written (that turn is then forgotten) without leaving the chat.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from ortserve.core.errors import OrtServeError
from ortserve.core.generation import GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings

BYE = ("/bye", "/exit")
HELP = """\
Available commands:
  /clear   forget the conversation so far
  /bye     leave (or Ctrl-D)
  /?       this help
Ctrl-C stops an answer being written."""


def load(settings: EngineSettings) -> Service:
    """Load the model for a terminal session: no batching (one person asks, and the
    answer's tokens are computed in this thread, which Python's KeyboardInterrupt
    stops), and every thread the load starts (onnxruntime's pool) blocks SIGINT, so that
    the kernel hands Ctrl-C to this thread: a prompt waiting in `input()` is woken only
    there."""
    settings = settings.model_copy(update={"max_batch": 1})
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to arrange
        return Service.load(settings)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        service = Service.load(settings)
        service.warm_up()  # threads started on a first generation are started now
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return service


def stdin_kind() -> str:
    """What standard input is: `tty` (a person types), `data` (a pipe or a file: the
    prompt), or `none` (/dev/null, closed, a socket: nothing to read)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # closed, or replaced by a non-file
        return "none"
    if sys.stdin.isatty():
        return "tty"
    return "data" if stat.S_ISFIFO(mode) or stat.S_ISREG(mode) else "none"


@dataclass(frozen=True)
class Session:
    """A loaded model and how to ask it.

    Attributes:
        service: The model's service.
        name: The model's name as the user gave it (for the banner and figures).
        options: Sampling options of every answer.
        verbose: Print each answer's figures (tokens, TTFT, tokens/s) on stderr.
    """

    service: Service
    name: str
    options: SamplingOptions
    verbose: bool = False

    def answer(self, messages: list[dict[str, Any]], out: TextIO) -> str | None:
        """Stream the model's answer to `messages` to `out`; its text, or None when Ctrl-C
        stopped it (a line says so)."""
        stream = self.service.stream(GenerationRequest(messages=messages, options=self.options))
        parts: list[str] = []
        try:
            for delta in stream:
                out.write(delta)
                out.flush()
                parts.append(delta)
        except KeyboardInterrupt:
            stream.close()
            out.write("\n")
            print("(answer stopped)", file=sys.stderr)
            return None
        finally:
            stream.close()
        out.write("\n")
        out.flush()
        done = stream.completion
        if self.verbose and done is not None:
            print(
                f"[{self.name}] {done.completion_tokens} tokens, prompt {done.prompt_tokens}, "
                f"TTFT {done.timings.ttft_s * 1000:.1f} ms, "
                f"{done.timings.decode_tokens_per_s:.1f} tok/s, finish {done.finish_reason}",
                file=sys.stderr,
            )
        return "".join(parts)


def answer_once(session: Session, prompt: str) -> int:
    """Answer `prompt` (a user's message) once; the exit code."""
    if not prompt.strip():
        print("ortserve run: error: the prompt is empty", file=sys.stderr)
        return 1
    text = session.answer([{"role": "user", "content": prompt}], sys.stdout)
    return 0 if text is not None else 128 + 2  # Ctrl-C: as the shell counts SIGINT


def chat(session: Session) -> int:
    """The interactive chat at a terminal, until `/bye` or Ctrl-D; the exit code."""
    with contextlib.suppress(ImportError):  # not on every platform
        import readline  # noqa: F401  # line editing and history for input()
    print(f"chatting with {session.name}: /bye or Ctrl-D to leave, /? for help", file=sys.stderr)
    history: list[dict[str, Any]] = []
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print("\nUse Ctrl-D or /bye to leave.")
            continue
        text = line.strip()
        if not text:
            continue
        if text in BYE:
            return 0
        if text in ("/?", "/help"):
            print(HELP)
            continue
        if text == "/clear":
            history.clear()
            print("(conversation cleared)")
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]!r}: /? lists them")
            continue
        turn = [*history, {"role": "user", "content": text}]
        try:
            reply = session.answer(turn, sys.stdout)
        except KeyboardInterrupt:  # before the first token (a long prompt's prefill)
            print("\n(answer stopped)", file=sys.stderr)
            continue
        except OrtServeError as exc:  # e.g. the conversation outgrew the context
            print(f"error: {exc.message} (/clear starts over)", file=sys.stderr)
            continue
        if reply is not None:
            history = [*turn, {"role": "assistant", "content": reply}]
