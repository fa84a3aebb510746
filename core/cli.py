"""The `ortserve` command: core's own subcommands plus those other packages register.

Other packages (bake, edge) add subcommands through the `ortserve.commands` entry-point
group, so core never imports them.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path

from core.errors import OrtServeError
from core.settings import EngineSettings


def _settings(args: argparse.Namespace) -> EngineSettings:
    overrides: dict[str, object] = {}
    if args.model_dir is not None:
        overrides["model_dir"] = args.model_dir
    if args.providers is not None:
        overrides["providers"] = args.providers
    if getattr(args, "threads", None) is not None:
        overrides["threads"] = args.threads
    return EngineSettings(**overrides)  # type: ignore[arg-type]  # validated by pydantic


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", type=Path, help="baked model folder (ORTSERVE_MODEL_DIR)")
    parser.add_argument("--providers", help="auto or a comma list, e.g. cuda,cpu")


def _generate(args: argparse.Namespace) -> int:
    from core.engine import Engine
    from core.generation import GenerationRequest, SamplingOptions

    engine = Engine.load(_settings(args))
    options = SamplingOptions(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )
    if args.chat:
        request = GenerationRequest(
            messages=[{"role": "user", "content": args.prompt}], options=options,
            stop=tuple(args.stop),
        )  # fmt: skip
    else:
        request = GenerationRequest(prompt=args.prompt, options=options, stop=tuple(args.stop))
    stream = engine.stream(request)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    done = stream.completion
    assert done is not None  # the stream ran to its end
    print(
        f"[{engine.model_name}] {done.completion_tokens} tokens, prompt {done.prompt_tokens}, "
        f"TTFT {done.timings.ttft_s * 1000:.1f} ms, "
        f"{done.timings.decode_tokens_per_s:.1f} tok/s, EP {engine.probe.provider}, "
        f"threads {engine.probe.threads}, finish {done.finish_reason}",
        file=sys.stderr,
    )
    return 0


def _probe(args: argparse.Namespace) -> int:
    from core.engine import Engine

    engine = Engine.load(_settings(args))
    probe = engine.probe
    rows = [(name, "skipped", reason) for name, reason in probe.skipped.items()]
    rows.append((probe.provider, "CHOSEN", f"loaded in {probe.load_seconds:.2f} s"))
    width = max(len(r[0]) for r in rows)
    print(f"model: {engine.model_name}  threads: {probe.threads}")
    for name, state, detail in rows:
        print(f"{name:<{width}}  {state:<7}  {detail}")
    quality = engine.manifest.quality
    print(f"quality gate: {quality.summary() if quality else 'not run (baked before the gate)'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full `ortserve` parser, with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="ortserve", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)

    gen = subparsers.add_parser("generate", help="generate text from a baked model")
    _add_engine_args(gen)
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="stop string (up to 4)")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--threads", type=int)
    gen.set_defaults(func=_generate)

    probe = subparsers.add_parser("probe", help="show which execution providers work")
    _add_engine_args(probe)
    probe.set_defaults(func=_probe)

    for entry in entry_points(group="ortserve.commands"):
        entry.load()(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ortserve` console script."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except OrtServeError as exc:
        print(f"ortserve {args.command}: error: {exc.message}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
