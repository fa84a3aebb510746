"""The memory a serving process needs: one formula for every generated limit.

Cloud Run's `service.yaml` and `sizing.json`, the Kubernetes Deployment, the Lambda
`MemorySize` (samconfig.toml) and the edge unit's `MemoryMax` all come from `memory_for`,
whose terms were measured on the served process (the real `ortserve serve`, VmRSS and
VmHWM, 2026-12-02, onnxruntime-genai 0.18, the 135M shape: 109 MiB of int4 files):

- runtime: Python, onnxruntime, the tokenizer and the server. Idle with the model loaded:
  276 MiB of RSS, so 167 MiB besides the model's files: `RUNTIME_MIB` rounds it up.
- model: the loaded weights; the load's peak (VmHWM, 286 MiB) was 1.09 x the files above
  the runtime: `MODEL_FACTOR`.
- KV cache: fp32 keys and values (2 x layers x KV heads x head size x 4 B a token) of
  every sequence that may run at once, each up to its token room (prompt + new tokens;
  og allocates the whole room when a sequence starts).
- one prefill part per sequence: a sequence keeps the logits of the last part it
  computed (part x vocabulary x 4 B) until its next step; with the part's other
  activations, the peak above the KV cache was 18-19 MiB (prompts of 1,000, 4,000 and
  8,000 tokens) for 12 MiB of logits at parts of 64, and 54-59 MiB for 48 MiB at parts of
  256 (`benchmarks.long_prompt`): `PART_FACTOR`.
- the prompt cache: its slots' KV caches (`PROMPT_CACHE_TOKENS` tokens each) and the
  logits of each one's last prompt part (`KEPT_LOGITS_TOKENS` positions at most).
- kept responses: the Responses API's conversations kept for `previous_response_id`
  (core.protocol.responses), at most `KEPT_RESPONSE_BYTES` (16 MiB) as they count them.
  They live in the serving process, once: a reload does not double them.
- a reload (the edge daemon's blue/green SIGHUP): the new model and its cache load
  beside the serving one.
- the engine process (the edge daemon and the Cloud Run image: og in a child process):
  a second Python with onnxruntime. Measured 2026-12-05 on the 135M shape after a
  1,500-token prompt: 80 MiB parent + 427 MiB engine against 452 MiB for one process, so
  `ENGINE_PROCESS_MIB` rounds the 55 MiB up (a reload's new engine brings its own too).
  The engine's own ceiling (`engine_ceiling`, RLIMIT_DATA) is the whole declared memory:
  in normal use it stays well under (VmData 466-663 MiB for 1,718 MiB declared there), and
  a runaway allocation fails in the engine before the cgroup's OOM killer could pick the
  daemon.

`tests/functional/test_long_prompt_memory.py` holds the declared concurrency of max-length
prompts on the 135M shape under the declared limit (peak RSS).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ortserve.core.manifest import read_manifest
from ortserve.core.prefill import KEPT_LOGITS_TOKENS
from ortserve.core.prompt_cache import SLOT_TOKENS
from ortserve.core.protocol.responses import KEPT_RESPONSE_BYTES
from ortserve.core.runtime import kv_bytes_per_token
from ortserve.core.service import ONE_PASS_PARTS
from ortserve.core.settings import EngineSettings

MIB = 1 << 20
RUNTIME_MIB = 256
ENGINE_PROCESS_MIB = 64
MODEL_FACTOR = 1.25
PART_FACTOR = 1.5
FP32_BYTES = 4
# A prompt-cache slot's room (the engine's, core.prompt_cache), and a sequence's default
# room where the model's context is longer: prompts are capped so that prompt + new
# tokens fit.
PROMPT_CACHE_TOKENS = SLOT_TOKENS
SEQUENCE_TOKENS = 4096

_DEFAULTS = EngineSettings.model_fields


def _default(name: str) -> int:
    value = _DEFAULTS[name].default
    assert isinstance(value, int)
    return value


# Where the context is longer than SEQUENCE_TOKENS, the room a sequence keeps for new
# tokens: prompts are capped at SEQUENCE_TOKENS - MAX_NEW_TOKENS and the new tokens at
# this (ORTSERVE_MAX_NEW_TOKENS; without it a request may ask for the whole context).
MAX_NEW_TOKENS = 512
# The engine's defaults, which the generated artefacts do not change.
# Sequences one process runs at once by default: MAX_CONCURRENCY generations, a batch
# (MAX_BATCH sequences) being one; long prompts run alone but side by side, as many.
SEQUENCES = _default("max_concurrency") * _default("max_batch")
PREFILL_CHUNK_TOKENS = _default("prefill_chunk_tokens")
# A batch's one pass (ORTSERVE_BATCH_PREFILL_TOKENS, rows x longest prompt) holds its
# activations, not its logits (a CPU bake keeps the last position's only): measured on
# Qwen2.5-Coder Q4_K_M bakes at 2,048 tokens, +204 MiB at 0.5B (hidden 896) and +420 MiB at
# 1.5B (hidden 1,536), i.e. 116 and 140 bytes per hidden unit and token; rounded up.
BATCH_PREFILL_TOKENS = _default("batch_prefill_tokens")
BATCH_PASS_BYTES_PER_HIDDEN = 160
PROMPT_CACHE_SLOTS = _default("prompt_cache_slots")
# An embedding model's largest pass (core.embedding: MAX_BATCH rows, MAX_BATCH_TOKENS
# tokens): its activations. Measured with benchmarks/embeddings.py (2026-12-07, peak RSS
# after a pass of 32 rows of 256 tokens above the loaded model, all-MiniLM-L6-v2): +284 MiB
# fp32, +17 MiB int8 (a row a pass); rounded up from the larger.
EMBEDDING_PASS_MIB = 320


@dataclass(frozen=True)
class Memory:
    """The terms of one process's memory and their sum, in MiB (rounded up).

    Attributes:
        total_mib: What the process may use at most: the sum of the terms.
        runtime_mib: Python, onnxruntime, the tokenizer, the server.
        model_mib: The loaded weights (the model's files x `MODEL_FACTOR`).
        kv_mib: The KV caches of `sequences` sequences of `tokens_per_sequence` tokens.
        parts_mib: One prefill part's logits and activations for each sequence (at
            least `ONE_PASS_PARTS`: a batch's or a beam search's one pass), or a batch's
            one pass of `BATCH_PREFILL_TOKENS` where sequences batch in an engine
            process, whichever is more.
        cache_mib: The prompt cache's slots.
        kept_mib: The Responses API's kept conversations (`KEPT_RESPONSE_BYTES`).
        reload_mib: A second model and its cache during a reload (0: no reloads), and
            its engine process's runtime where the model runs in one.
        engine_mib: The engine process's own runtime (0: og in the serving process).
        sequences: Sequences that may run at once.
        tokens_per_sequence: A sequence's room: prompt + new tokens.
        max_prompt_tokens: ORTSERVE_MAX_PROMPT_TOKENS that keeps a sequence in its room
            (0: the model's context does that).
        max_new_tokens: ORTSERVE_MAX_NEW_TOKENS that keeps a sequence in its room (0:
            the model's context does that: a request gets what fits after its prompt).
        kv_bytes_per_token: Keys and values of one token, every layer.
        prefill_chunk_tokens: The part size the sum assumes.
    """

    total_mib: int
    runtime_mib: int
    model_mib: int
    kv_mib: int
    parts_mib: int
    cache_mib: int
    kept_mib: int
    reload_mib: int
    engine_mib: int
    sequences: int
    tokens_per_sequence: int
    max_prompt_tokens: int
    max_new_tokens: int
    kv_bytes_per_token: int
    prefill_chunk_tokens: int

    def record(self) -> dict[str, Any]:
        """The terms as `sizing.json` states them."""
        return {
            **asdict(self),
            "formula": "runtime + engine + model + kv + parts + cache + kept + reload",
        }


def memory_for(
    model_bytes: int,
    config: dict[str, Any],
    sequences: int,
    chunk: int = PREFILL_CHUNK_TOKENS,
    cache_slots: int = PROMPT_CACHE_SLOTS,
    reloads: bool = False,
    engine_process: bool = False,
    kv_element_bytes: int = FP32_BYTES,
) -> Memory:
    """The memory of a process serving a model of `model_bytes` (genai_config's `model`
    section `config`) to `sequences` sequences at once, each with room for the model's
    context up to `SEQUENCE_TOKENS` tokens (prompts capped to fit, see
    `Memory.max_prompt_tokens`); with `reloads`, room for a second model beside it; with
    `engine_process`, og runs in a process of its own (ORTSERVE_ENGINE_PROCESS)."""
    context = int(config.get("context_length") or SEQUENCE_TOKENS)
    tokens = min(context, SEQUENCE_TOKENS)
    per_token = kv_bytes_per_token(config, kv_element_bytes)
    vocab = int(config.get("vocab_size") or 0)

    def mib(value: float) -> int:
        return math.ceil(value / MIB)

    model = mib(MODEL_FACTOR * model_bytes)
    kv = mib(sequences * tokens * per_token)
    # A pass og takes at once (a batch's, a beam search's) may be ONE_PASS_PARTS parts.
    passes = max(sequences, ONE_PASS_PARTS)
    parts = mib(passes * PART_FACTOR * min(chunk, tokens) * vocab * FP32_BYTES)
    if sequences > 1 and engine_process:  # (core.service: only there)
        hidden = int(config.get("decoder", {}).get("hidden_size") or 0)
        batch_pass = BATCH_PASS_BYTES_PER_HIDDEN * hidden * BATCH_PREFILL_TOKENS
        parts = max(parts, mib(batch_pass))
    slot = min(context, PROMPT_CACHE_TOKENS) * per_token + KEPT_LOGITS_TOKENS * vocab * FP32_BYTES
    cache = mib(cache_slots * slot)
    kept = mib(KEPT_RESPONSE_BYTES)
    engine = ENGINE_PROCESS_MIB if engine_process else 0
    reload = model + cache + engine if reloads else 0
    return Memory(
        total_mib=RUNTIME_MIB + engine + model + kv + parts + cache + kept + reload,
        runtime_mib=RUNTIME_MIB,
        model_mib=model,
        kv_mib=kv,
        parts_mib=parts,
        cache_mib=cache,
        kept_mib=kept,
        reload_mib=reload,
        engine_mib=engine,
        sequences=sequences,
        tokens_per_sequence=tokens,
        max_prompt_tokens=tokens - MAX_NEW_TOKENS if context > SEQUENCE_TOKENS else 0,
        max_new_tokens=MAX_NEW_TOKENS if context > SEQUENCE_TOKENS else 0,
        kv_bytes_per_token=per_token,
        prefill_chunk_tokens=chunk,
    )


def embedding_memory(model_bytes: int, reloads: bool = False) -> Memory:
    """The memory of a process serving an embedding model of `model_bytes` (core.embedding:
    onnxruntime in the serving process, no KV cache, no engine process): the runtime, the
    weights and one pass's activations (`EMBEDDING_PASS_MIB`); with `reloads`, a second
    model beside it."""
    model = math.ceil(MODEL_FACTOR * model_bytes / MIB)
    reload = model if reloads else 0
    return Memory(
        total_mib=RUNTIME_MIB + model + EMBEDDING_PASS_MIB + reload,
        runtime_mib=RUNTIME_MIB,
        model_mib=model,
        kv_mib=0,
        parts_mib=EMBEDDING_PASS_MIB,
        cache_mib=0,
        kept_mib=0,
        reload_mib=reload,
        engine_mib=0,
        sequences=1,
        tokens_per_sequence=0,
        max_prompt_tokens=0,
        max_new_tokens=0,
        kv_bytes_per_token=0,
        prefill_chunk_tokens=0,
    )


def model_memory(
    model_dir: Path,
    sequences: int = SEQUENCES,
    reloads: bool = False,
    engine_process: bool = False,
) -> Memory:
    """`memory_for` the baked model in `model_dir` (its manifest's files, its
    genai_config.json); `embedding_memory` for an embedding model."""
    manifest = read_manifest(model_dir)
    model_bytes = sum(f.size for f in manifest.files)
    if manifest.kind == "embedding":
        return embedding_memory(model_bytes, reloads)
    config = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))
    return memory_for(
        model_bytes,
        config["model"],
        sequences,
        reloads=reloads,
        engine_process=engine_process,
        kv_element_bytes=manifest.kv_cache_element_bytes,
    )


def engine_ceiling(terms: Memory) -> dict[str, str]:
    """The engine process's ceiling an artefact ships (`ORTSERVE_ENGINE_MEMORY_MB`: the
    whole declared memory), where the model runs in one; else none."""
    return {"ORTSERVE_ENGINE_MEMORY_MB": str(terms.total_mib)} if terms.engine_mib else {}


def shipped_caps(terms: Memory) -> dict[str, str]:
    """The settings an artefact ships so that a request stays in the room `terms` counts
    for it (`ORTSERVE_MAX_PROMPT_TOKENS` and `ORTSERVE_MAX_NEW_TOKENS`), as environment
    variables; none where the model's context is that room already. Without them a
    request may take the whole context: 4 prompts of 8,100 tokens on the 135M shape (an
    8,192 context) peaked at 1,978 MiB against 1,404 MiB declared."""
    if not terms.max_prompt_tokens:
        return {}
    return {
        "ORTSERVE_MAX_PROMPT_TOKENS": str(terms.max_prompt_tokens),
        "ORTSERVE_MAX_NEW_TOKENS": str(terms.max_new_tokens),
    }


def write_record(path: Path, terms: Memory, **derived: Any) -> None:
    """`sizing.json`: what a target `derived` from the formula, the settings that keep
    requests in its room (`shipped_caps`; the Cloud Functions target reads them from
    here), and its terms."""
    record = {**derived, "settings": shipped_caps(terms), "terms": terms.record()}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
