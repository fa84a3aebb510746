"""`ortserve run MODEL [PROMPT]` at a terminal, as `ollama run`: one answer, or a chat.

The model loads in this process (no HTTP server): the answer streams to stdout as it is
generated. The interactive chat keeps the conversation (each turn goes through the model's
chat template with the turns before it), ends with `/bye` or Ctrl-D, and Ctrl-C stops the
answer being written (that turn is then forgotten) without leaving the chat. As in
Ollama's: `/set parameter NAME VALUE` and `/set system TEXT` change the next answers,
`/show` says what the model and its settings are, and three double quotes begin and end
a message of several lines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from dataclasses import dataclass, replace
from typing import Any, TextIO

from ortserve.core.errors import OrtServeError
from ortserve.core.generation import GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings

BYE = ("/bye", "/exit")
MULTILINE = '"""'
HELP = f"""\
Available commands:
  /set parameter NAME VALUE   set a sampling option (/set parameter: the names)
  /set system TEXT            set the system prompt (/set system: none)
  /show [info|parameters|system]
                              the model, and the options the next answers use
  /clear                      forget the conversation so far
  /bye                        leave (or Ctrl-D)
  /?                          this help
Use {MULTILINE} to begin a message of several lines, and {MULTILINE} to end it.
Ctrl-C stops an answer being written."""

# `/set parameter` names (Ollama's, and the `ortserve generate` flags' spelling) for
# SamplingOptions' fields, with how each value is read and checked.
PARAMETERS: dict[str, tuple[str, type, float | None]] = {
    "temperature": ("temperature", float, 0.0),
    "top_p": ("top_p", float, 0.0),
    "top_k": ("top_k", int, 0),
    "seed": ("seed", int, None),
    "num_predict": ("max_new_tokens", int, 1),
    "max_new_tokens": ("max_new_tokens", int, 1),
    "repeat_penalty": ("repetition_penalty", float, 0.0),
    "repetition_penalty": ("repetition_penalty", float, 0.0),
}


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
        system: The system prompt before every conversation (`/set system`); "": none.
    """

    service: Service
    name: str
    options: SamplingOptions
    verbose: bool = False
    system: str = ""

    def answer(self, messages: list[dict[str, Any]], out: TextIO) -> str | None:
        """Stream the model's answer to `messages` (after the system prompt, if any) to
        `out`; its text, or None when Ctrl-C stopped it (a line says so)."""
        if self.system:
            messages = [{"role": "system", "content": self.system}, *messages]
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
            text = _message(input(">>> "))
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print("\nUse Ctrl-D or /bye to leave.")
            continue
        if not text.strip():
            continue
        command = text.strip()
        if command in BYE:
            return 0
        if command in ("/?", "/help"):
            print(HELP)
            continue
        if command == "/clear":
            history.clear()
            print("(conversation cleared)")
            continue
        if command.startswith("/set") or command.startswith("/show"):
            session = _command(session, command)
            continue
        if command.startswith("/"):
            print(f"unknown command {command.split()[0]!r}: /? lists them")
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


def _message(line: str) -> str:
    """The message `line` begins: itself, or from a line that begins with MULTILINE to
    the line that ends with it (the quotes dropped), as Ollama reads one."""
    if not line.lstrip().startswith(MULTILINE):
        return line
    text = line.lstrip()[len(MULTILINE) :]
    lines = [text]
    while not lines[-1].rstrip().endswith(MULTILINE):
        lines.append(input("... "))
    lines[-1] = lines[-1].rstrip().removesuffix(MULTILINE)
    return "\n".join(lines).strip("\n")


def _command(session: Session, command: str) -> Session:
    """Carry out a `/set` or `/show` command (what it says is printed); the session the
    next answers use."""
    words = command.split(maxsplit=3)
    if words[0] == "/show":
        print(_show(session, words[1] if len(words) > 1 else "all"))
        return session
    if words[0] != "/set" or len(words) < 2 or words[1] not in ("parameter", "system"):
        print("usage: /set parameter NAME VALUE, /set system TEXT, /show: /? for help")
        return session
    if words[1] == "system":
        system = command.split(maxsplit=2)[2].strip() if len(words) > 2 else ""
        system = system.removeprefix(MULTILINE).removesuffix(MULTILINE).strip()
        print(f"Set system message: {system}" if system else "Cleared system message.")
        return replace(session, system=system)
    if len(words) != 4 or words[2] not in PARAMETERS:
        print(f"usage: /set parameter NAME VALUE; NAME: {', '.join(PARAMETERS)}")
        return session
    return _set_parameter(session, words[2], words[3])


def _set_parameter(session: Session, name: str, text: str) -> Session:
    """`/set parameter NAME VALUE`: the session with that sampling option, or as it was
    when the value is not one (said)."""
    field, kind, least = PARAMETERS[name]
    try:
        value = kind(text)
    except ValueError:
        print(f"{name}: not a {kind.__name__}: {text!r}")
        return session
    if least is not None and (value < least or (field == "top_p" and not 0 < value <= 1)):
        limit = "in (0, 1]" if field == "top_p" else f"at least {least:g}"
        print(f"{name}: must be {limit}, got {value}")
        return session
    print(f"Set parameter '{name}' to '{value}'")
    return replace(session, options=replace(session.options, **{field: value}))


def _show(session: Session, what: str) -> str:
    """`/show [info|parameters|system]`: the model, the options the next answers use (a
    sampling option not set is the model's default, said as such), the system prompt."""
    engine = session.service.engine
    manifest = engine.manifest
    info = [
        ("model", session.name),
        ("baked from", manifest.source or "-"),
        ("precision", manifest.precision),
        ("context length", str(engine.context_length or "-")),
        ("runs on", f"{engine.probe.provider}, {engine.probe.threads} threads"),
    ]
    options = session.options
    defaults = engine.sampling_defaults  # what a field the session leaves unset becomes
    parameters: list[tuple[str, object]] = []
    for label, field in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("repeat_penalty", "repetition_penalty"),
    ):
        value = getattr(options, field)
        shown = f"{getattr(defaults, field)} ({defaults.origin})" if value is None else value
        parameters.append((label, shown))
    parameters += [
        ("num_predict", options.max_new_tokens),
        ("seed", options.seed if options.seed is not None else "-"),
    ]
    parts = {
        "info": "Model\n" + "\n".join(f"  {k:<16}{v}" for k, v in info),
        "parameters": "Parameters\n" + "\n".join(f"  {k:<16}{v}" for k, v in parameters),
        "system": f"System\n  {session.system or '(none)'}",
    }
    if what == "all":
        return "\n\n".join(parts.values())
    return parts.get(what, "usage: /show [info|parameters|system]")
