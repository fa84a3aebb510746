"""What a Lambda cold start costs: `python -m benchmarks.lambda_cold_start`.

For each model, alternates (A/B/A/B...) two fresh processes and times each from process
start to the first answer:

- `lambda`: the image's real entry point, `python -m awslambdaric
  ortserve.functions.aws.handler.handler`, run in the Lambda bake output (the image's /var/task)
  against a loopback fake of the Lambda Runtime API with one invocation queued (a
  `POST /generate` of one token through an HTTP API event): init + first invoke, until the
  runtime client posts the response;
- `bare`: a script that imports onnxruntime_genai, loads the same model folder, tokenizes
  and generates the first token, until it prints it.

The bundle gets what the image has: the Dockerfile's bytecode step (`compileall`) is run on
it and its ENV is applied (with PYTHONDONTWRITEBYTECODE=1, as /var/task is read-only).
Models are baked with `ortserve bake --target lambda-x86_64` under `--work` when missing.
Page cache warm (every variant reads the same files). Not a test: medians and the ratio
from one run on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bakes import baked
from benchmarks.support.dockerfile import image_env, run_compile_steps
from benchmarks.support.lambda_events import v2_event
from benchmarks.support.lambda_runtime_api import running
from benchmarks.support.servers import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "functions" / "aws" / "Dockerfile"
HANDLER = "ortserve.functions.aws.handler.handler"
BARE = """
import sys, onnxruntime_genai as og
config = og.Config(sys.argv[1])
config.overlay('{"model": {"decoder": {"session_options": {"intra_op_num_threads": %d}}}}')
model = og.Model(config)
tokenizer = og.Tokenizer(model)
ids = tokenizer.encode("Hello")
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(ids) + 1)
generator = og.Generator(model, params)
generator.append_tokens(ids)
generator.generate_next_token()
print(int(generator.get_next_tokens()[0]), flush=True)
"""


def _lambda(bundle: Path, threads: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    with running() as api:
        env.update(image_env(DOCKERFILE, bundle))  # the image's ENV
        env.update(
            AWS_LAMBDA_RUNTIME_API=api.address,
            AWS_LAMBDA_FUNCTION_NAME="ortserve",
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE="3008",
            AWS_LAMBDA_INITIALIZATION_TYPE="on-demand",
            LAMBDA_TASK_ROOT=str(bundle),
            PYTHONPATH=str(bundle),
            PYTHONDONTWRITEBYTECODE="1",
            ORTSERVE_THREADS=str(threads),
            # The template refuses a deployment without keys unless told: this one is told
            # (keys would cost their resolution, not what is measured).
            ORTSERVE_ALLOW_UNAUTHENTICATED="true",
        )
        event = v2_event(
            "POST",
            "/generate",
            {"content-type": "application/json"},
            json.dumps({"prompt": "Hello", "max_new_tokens": 1}).encode(),
        )
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "awslambdaric", HANDLER]
        with ServerProcess(cmd, env, cwd=bundle):
            outcome = api.invoke(event)
            elapsed = time.perf_counter() - start
    assert outcome.kind == "response" and outcome.json()["statusCode"] == 200, outcome.body
    return elapsed


def _bare(model_dir: Path, threads: int) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", BARE % threads, str(model_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    proc.wait(30)
    assert line.strip().isdigit(), line
    return elapsed


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="builtin:tiny-llama,builtin:smollm2-135m-shape")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    for model in args.models.split(","):
        bundle = baked(args.work, model, "lambda-x86_64")
        run_compile_steps(DOCKERFILE, bundle)  # the image's bytecode step
        _lambda(bundle, args.threads)  # warm the page cache for both
        runs: dict[str, list[float]] = {"lambda": [], "bare": []}
        for _ in range(args.reps):
            runs["lambda"].append(_lambda(bundle, args.threads))
            runs["bare"].append(_bare(bundle / "model", args.threads))
        med = {k: statistics.median(v) for k, v in runs.items()}
        results[model] = {**med, "ratio": med["lambda"] / med["bare"]}
        ratio = med["lambda"] / med["bare"]
        print(
            f"{model}: lambda cold start {med['lambda']:.3f} s, bare script "
            f"{med['bare']:.3f} s, ratio {ratio:.2f} (goal <= 1.5)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
