"""The engine and its service on the tiny baked model: streaming, stops, limits, chat,
guidance, admission, batching."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import jsonschema
import pytest

from ortserve.core.engine import Engine
from ortserve.core.errors import (
    BusyError,
    InvalidRequestError,
    ModelIntegrityError,
    ProviderUnavailableError,
)
from ortserve.core.generation import GenerationRequest, Guidance, SamplingOptions
from ortserve.core.manifest import list_files, read_manifest, write_manifest
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings
from tests.functional.batching import concurrently

PROMPT = "Serverless functions start cold, load the model once"


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path) -> Service:
    return Service.load(EngineSettings(model_dir=tiny_model_dir, providers="cpu"))


@pytest.fixture(scope="module")
def engine(service: Service) -> Engine:
    return service.engine


def _req(n: int = 48, **kw: object) -> GenerationRequest:
    options = SamplingOptions(max_new_tokens=n, min_new_tokens=n)
    return GenerationRequest(prompt=PROMPT, options=options, **kw)  # type: ignore[arg-type]


def test_stream_equals_generate_and_the_tokens_decoded(service: Service, engine: Engine) -> None:
    deltas = list(service.stream(_req()))
    done = service.generate(_req())
    assert "".join(deltas) == done.text
    assert done.completion_tokens == 48
    assert done.finish_reason == "length"
    assert done.prompt_tokens == len(engine.encode(PROMPT))
    assert done.timings.ttft_s > 0
    assert done.timings.decode_tokens_per_s > 0


def test_same_seed_same_text(service: Service, engine: Engine) -> None:
    def sample(seed: int) -> str:
        options = SamplingOptions(max_new_tokens=32, min_new_tokens=32, temperature=1.0, seed=seed)
        return service.generate(GenerationRequest(prompt=PROMPT, options=options)).text

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)
    # Any int64 seed works (onnxruntime-genai takes int32: the engine folds it).
    assert sample(2**31 + 11) == sample(11)
    assert sample(-1) == sample(-1)


def test_multibyte_utf8_is_never_split(engine: Engine) -> None:
    """Byte-level tokens that split characters stream as whole characters only."""
    text = "Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \u0645\u0631\u062d\u0628\u0627 "
    text += "\U0001f600\U0001f680"
    ids = engine.encode(text)
    pieces = list(engine.detokenize(ids))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # Some characters span several tokens: their first tokens yield nothing.
    assert "" in pieces
    assert len(ids) > len(text.encode()) / 4


def test_streamed_text_has_no_broken_characters(service: Service, engine: Engine) -> None:
    """Random tokens split characters anywhere: the deltas still join to the text of the
    whole token sequence (where the bytes are not valid UTF-8 at all, U+FFFD, as in
    transformers' decode), so no delta ever ends inside a character."""
    for seed in range(10):
        options = SamplingOptions(max_new_tokens=40, min_new_tokens=40, temperature=1.2, seed=seed)
        deltas = list(service.stream(GenerationRequest(prompt=PROMPT, options=options)))
        tokens = list(engine.stream_tokens(engine.encode(PROMPT), options))
        assert "".join(deltas) == engine.text.decode(tokens)


def test_stop_string_split_across_tokens_is_cut_exactly(service: Service) -> None:
    deltas = list(service.stream(_req()))
    full = "".join(deltas)
    # A stop string that spans the border between two tokens' text.
    border = 0
    for i in range(len(deltas) - 1):
        border += len(deltas[i])
        stop = full[border - 2 : border + 2]
        if (
            len(deltas[i]) >= 2
            and len(deltas[i + 1]) >= 2
            and full.find(stop) == border - 2
            and "\ufffd" not in stop
        ):
            break
    else:
        pytest.fail("no token border with 2+2 clean characters")
    stream = service.stream(_req(stop=(stop, "never-there")))
    cut = list(stream)
    text = "".join(cut)
    assert text == full[: border - 2]
    assert all(stop not in d for d in cut)
    assert stream.completion is not None
    assert stream.completion.finish_reason == "stop"
    assert service.generate(_req(stop=(stop,))).text == text


def test_length_limit_and_context_overflow(service: Service, engine: Engine) -> None:
    done = service.generate(GenerationRequest(prompt=PROMPT, options=SamplingOptions(5, 5)))
    assert done.completion_tokens == 5
    assert done.finish_reason == "length"
    long_ids_text = " ".join(["fox"] * 3000)
    with pytest.raises(InvalidRequestError, match="model's context is 2048 tokens"):
        service.generate(GenerationRequest(prompt=long_ids_text))
    # Room for only a few new tokens: max_new_tokens is capped by the context.
    prompt_ids = engine.encode(long_ids_text)[:2040]
    tokens = list(engine.stream_tokens(prompt_ids, SamplingOptions(100, 100)))
    assert len(tokens) == 8


def test_too_many_stop_strings() -> None:
    with pytest.raises(InvalidRequestError, match="at most 4 stop strings"):
        GenerationRequest(prompt="x", stop=("a", "b", "c", "d", "e"))


def test_chat_template_applies(service: Service, engine: Engine) -> None:
    prompt = engine.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    done = service.generate(
        GenerationRequest(messages=[{"role": "user", "content": "Hi"}], options=SamplingOptions(4))
    )
    assert done.prompt_tokens == len(engine.encode(prompt))


def _with_template(src: Path, dst: Path, template: str | None) -> Path:
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").unlink()
    if template is not None:
        (dst / "chat_template.jinja").write_text(template)
    manifest = read_manifest(dst).model_copy(update={"files": list_files(dst)})
    write_manifest(dst, manifest)
    return dst


def test_chat_template_fallback_for_replace(tiny_model_dir: Path, tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}[{{ m['role'] | upper }}] "
        "{{ m['content'].replace('cold', 'warm') }}\n{% endfor %}"
        "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
    )
    folder = _with_template(tiny_model_dir, tmp_path / "m", template)
    engine = Engine.load(EngineSettings(model_dir=folder, providers="cpu"))
    prompt = engine.apply_chat_template([{"role": "user", "content": "a cold start"}])
    assert prompt == "[USER] a warm start\n[ASSISTANT] "


def test_model_without_chat_template_refuses_chat(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = _with_template(tiny_model_dir, tmp_path / "m", None)
    service = Service.load(EngineSettings(model_dir=folder, providers="cpu"))
    with pytest.raises(InvalidRequestError, match="has no chat template"):
        service.generate(GenerationRequest(messages=[{"role": "user", "content": "hi"}]))
    assert service.admission.active == 0


def test_json_schema_guidance_output_validates(service: Service) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
    }
    for seed in range(3):
        options = SamplingOptions(max_new_tokens=120, temperature=1.0, seed=seed)
        done = service.generate(
            GenerationRequest(
                prompt=PROMPT, options=options, guidance=Guidance("json_schema", json.dumps(schema))
            )
        )
        assert done.finish_reason == "stop"
        jsonschema.validate(json.loads(done.text), schema)


def test_regex_guidance_and_invalid_guidance(service: Service) -> None:
    done = service.generate(
        GenerationRequest(
            prompt=PROMPT,
            options=SamplingOptions(30),
            guidance=Guidance("regex", "[0-9]{3}-[a-z]{2}"),
        )
    )
    assert done.finish_reason == "stop"
    assert len(done.text) == 6
    assert done.text[3] == "-"
    with pytest.raises(InvalidRequestError, match="invalid guidance"):
        service.generate(GenerationRequest(prompt=PROMPT, guidance=Guidance("json_schema", "{x")))
    assert service.admission.active == 0


def test_closing_a_stream_cancels_and_frees_the_slot(service: Service) -> None:
    stream = service.stream(_req(200))
    next(stream)
    next(stream)
    assert service.admission.active == 1
    stream.close()
    assert service.admission.active == 0
    assert stream.completion is not None
    assert stream.completion.finish_reason == "cancelled"
    assert stream.completion.completion_tokens < 200
    unstarted = service.stream(_req())
    assert service.admission.active == 1
    unstarted.close()
    assert service.admission.active == 0
    assert service.generate(_req(4)).completion_tokens == 4


def test_busy_after_the_queue_timeout(tiny_model_dir: Path) -> None:
    settings = EngineSettings(
        model_dir=tiny_model_dir,
        providers="cpu",
        max_concurrency=1,
        max_batch=1,  # one generation holds the only slot (a batch place would leave room)
        max_queue=1,
        queue_timeout_s=0.2,
    )
    service = Service.load(settings)
    holder = service.stream(_req(100))
    next(holder)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            service.generate(_req(4))
        except BusyError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(errors) == 3  # one timed out in the queue, two found it full
    assert {str(e).split(":")[1].strip() for e in errors} == {"queue full", "no slot within 0.2 s"}
    assert all(isinstance(e, BusyError) and e.retry_after_s >= 1 for e in errors)
    holder.close()
    assert service.generate(_req(4)).completion_tokens == 4


def test_probe_falls_back_to_cpu_and_records_why(tiny_model_dir: Path) -> None:
    engine = Engine.load(EngineSettings(model_dir=tiny_model_dir, providers="cuda,cpu"))
    assert engine.probe.provider == "cpu"
    assert set(engine.probe.skipped) == {"cuda"}
    assert engine.probe.skipped["cuda"].startswith(("not installed", "failed to initialise"))
    auto = Engine.load(EngineSettings(model_dir=tiny_model_dir, providers="auto"))
    assert auto.probe.provider == "cpu"
    assert list(auto.probe.skipped) == ["cuda", "coreml", "qnn", "openvino", "dml", "webgpu"]


def test_cuda_only_fails_clearly(tiny_model_dir: Path) -> None:
    with pytest.raises(ProviderUnavailableError, match="no allowed execution provider") as info:
        Engine.load(EngineSettings(model_dir=tiny_model_dir, providers="cuda"))
    assert "cuda:" in info.value.message


def _batching_service(model_dir: Path) -> Service:
    # Two generations at once: room for a blocker beside a full batch (see `_as_one_batch`).
    settings = EngineSettings(
        model_dir=model_dir, providers="cpu", max_batch=4, max_concurrency=2, batch_window_ms=50
    )
    return Service.load(settings)


def _as_one_batch(service: Service, requests: list[GenerationRequest]) -> list[str]:
    """The texts of `requests`, which must all have decoded as one batch."""
    texts, batches, sequences = concurrently(service, requests)
    assert (batches, sequences) == (1, len(requests))
    return texts


def test_concurrent_greedy_requests_batch_and_match_unbatched(
    service: Service, tiny_model_dir: Path
) -> None:
    prompts = ["Hello there", "The quick brown fox jumps over the lazy dog", "Edge", "Cold"]
    lengths = [24, 7, 40, 16]
    requests = [
        GenerationRequest(prompt=p, options=SamplingOptions(n))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    alone = [service.generate(r).text for r in requests]  # one by one: each runs alone
    assert _as_one_batch(_batching_service(tiny_model_dir), requests) == alone


def test_requests_forced_to_their_limits_batch_together_and_match_unbatched(
    service: Service, tiny_model_dir: Path
) -> None:
    """`ignore_eos` (a minimum that is the limit) batches with its like: og holds EOS back
    for the whole batch, and each row still stops at its own limit, as it does alone."""
    # The tiny model ends these with EOS after 19, 20 and 24 tokens when it may.
    prompts = [". edge and", "! fox 1", "run and"]
    free = [
        service.generate(GenerationRequest(prompt=p, options=SamplingOptions(60))) for p in prompts
    ]
    assert [c.finish_reason for c in free] == ["stop"] * 3
    lengths = [40, 32, 48]
    requests = [
        GenerationRequest(prompt=p, options=SamplingOptions(n, min_new_tokens=n))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    alone = [service.generate(r) for r in requests]
    assert [c.completion_tokens for c in alone] == lengths
    assert _as_one_batch(_batching_service(tiny_model_dir), requests) == [c.text for c in alone]


@pytest.mark.slow
def test_a_pruned_lm_head_batches_prompts_of_different_lengths_right(
    tiny_hf_dir: Path,
) -> None:
    """`prune_lm_head=true` computes the logits of one position a pass: each row's own last
    prompt token (bake.upstream), not position -1, which is a pad for a batch's shorter,
    right-padded prompts (og 0.18's builder: their answers turned to "lik lik lik...").
    Batched answers equal the answers alone, on the pruned bake."""
    from tests.models import baked

    pruned = (
        baked(str(tiny_hf_dir), package=False, extra=("--builder-option", "prune_lm_head=true"))
        / "model"
    )
    requests = [
        GenerationRequest(prompt=p, options=SamplingOptions(n))
        for p, n in zip(
            ["Hello there", "The quick brown fox jumps over the lazy dog", "Edge", "Cold"],
            [24, 7, 40, 16],
            strict=True,
        )
    ]
    alone = Service.load(EngineSettings(model_dir=pruned, providers="cpu"))
    expected = [alone.generate(r).text for r in requests]
    assert _as_one_batch(_batching_service(pruned), requests) == expected


def test_a_short_request_keeps_its_budget_beside_a_long_one(
    service: Service, engine: Engine, tiny_model_dir: Path
) -> None:
    """Sequences that would not fit the context together (the batch pads every prompt to
    the longest) go to separate batches: the short one gets what it gets alone."""
    words = 2000
    while len(engine.encode(" ".join(["fox"] * words))) > 1995:  # of a 2,048 context
        words -= 5
    long_prompt = " ".join(["fox"] * words)
    requests = [
        GenerationRequest(prompt="hi", options=SamplingOptions(200)),
        GenerationRequest(prompt=long_prompt, options=SamplingOptions(20)),
    ]
    alone = [service.generate(r).text for r in requests]
    texts, batches, _ = concurrently(_batching_service(tiny_model_dir), requests)
    assert texts == alone
    assert batches == 2  # one each


def test_a_lone_request_runs_by_itself_and_frees_the_batcher_however_it_ends(
    tiny_model_dir: Path,
) -> None:
    batched = _batching_service(tiny_model_dir)
    batcher = batched._batcher
    assert batcher is not None

    def lone(n: int) -> GenerationRequest:
        return GenerationRequest(prompt=PROMPT, options=SamplingOptions(n))  # batchable

    stream = batched.stream(lone(200))
    next(stream)  # runs by itself: the batcher waits for it, nothing is pending
    assert batcher.batches_run == 1 and not batcher._pending
    stream.close()
    assert stream.completion is not None and stream.completion.finish_reason == "cancelled"
    batched.stream(lone(200)).close()  # closed before it started
    # A lone stream whose reader pauses computes nothing: the next request runs beside it
    # (one thread reading two streams in turn must not hang).
    paused = batched.stream(lone(200))
    next(paused)
    other = batched.stream(lone(200))
    assert next(other) and next(paused)
    other.close()
    paused.close()
    assert batched.generate(lone(4)).completion_tokens == 4  # the batcher is free again
    assert batched.generate(lone(4)).text == batched.generate(lone(4)).text
    assert batched.admission.active == 0


def test_a_batched_stream_can_stop_and_cancel(service: Service, tiny_model_dir: Path) -> None:
    batched = Service.load(
        EngineSettings(model_dir=tiny_model_dir, providers="cpu", max_batch=2, batch_window_ms=0)
    )
    full = service.generate(_req()).text
    stop = full[10:13]
    assert batched.generate(_req(stop=(stop,))).text == full[: full.find(stop)]
    stream = batched.stream(_req(200))
    next(stream)
    stream.close()
    assert stream.completion is not None and stream.completion.finish_reason == "cancelled"
    assert batched.admission.active == 0
    unstarted = batched.stream(_req(200))
    unstarted.close()
    assert batched.admission.active == 0
    assert batched.generate(_req(4)).completion_tokens == 4


def test_unseeded_sampled_requests_batch_and_seeded_ones_run_alone(tiny_model_dir: Path) -> None:
    batched = _batching_service(tiny_model_dir)
    sampled = SamplingOptions(max_new_tokens=12, temperature=0.9, top_p=0.95, top_k=40)
    texts = _as_one_batch(
        batched,
        [GenerationRequest(prompt=p, options=sampled) for p in ("Hello", "Edge", "Cold", "Lambda")],
    )
    assert all(texts)
    # Different sampling options never share a batch (one set of search options each).
    other = SamplingOptions(max_new_tokens=12, temperature=0.5)
    with pytest.raises(AssertionError, match=r"\(2, 2\) == \(1, 2\)"):
        _as_one_batch(
            batched,
            [
                GenerationRequest(prompt="a", options=sampled),
                GenerationRequest(prompt="b", options=other),
            ],
        )
    # A seed promises the same output: seeded requests keep a generator of their own,
    # so they never reach the batcher.
    seeded = [
        GenerationRequest(prompt="Hello", options=SamplingOptions(16, temperature=0.9, seed=s))
        for s in (1, 2, 1)
    ]
    assert batched._batcher is not None
    runs = batched._batcher.sequences_run
    alone = [batched.generate(r).text for r in seeded]
    threads = [threading.Thread(target=batched.generate, args=(r,)) for r in seeded]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert alone[0] == alone[2] and batched._batcher.sequences_run == runs
    assert batched.admission.active == 0


@pytest.mark.slow
def test_logits_at_every_position_also_from_a_pruned_lm_head(
    engine: Engine, tiny_hf_dir: Path
) -> None:
    """The quality gate scores every position; `prune_lm_head` bakes compute only the last
    one in a pass, so the engine feeds them token by token, with the same result."""
    import numpy as np

    from tests.models import baked

    ids = engine.encode("Edge boards run a daemon under systemd and answer on the network.")
    full = engine.logits(ids)
    assert full.shape == (len(ids), engine.vocab_size)
    # Row i predicts token i + 1: its last row equals the first step of a generation.
    first = next(iter(engine.stream_tokens(ids, SamplingOptions(1))))
    assert int(full[-1].argmax()) == first
    pruned_dir = (
        baked(str(tiny_hf_dir), package=False, extra=("--builder-option", "prune_lm_head=true"))
        / "model"
    )
    pruned = Engine.load(EngineSettings(model_dir=pruned_dir, providers="cpu")).logits(ids)
    assert pruned.shape == full.shape
    assert np.allclose(pruned, full, atol=1e-3)
    with pytest.raises(InvalidRequestError, match="cannot score 0 tokens"):
        engine.logits([])


def test_engine_refuses_a_tampered_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "m"
    shutil.copytree(tiny_model_dir, copy)
    data = bytearray((copy / "model.onnx.data").read_bytes())
    data[100] ^= 0xFF
    (copy / "model.onnx.data").write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=r"model\.onnx\.data does not match"):
        Engine.load(EngineSettings(model_dir=copy, verify_sha256=True))
    (copy / "model.onnx.data").write_bytes(bytes(data[:-10]))
    with pytest.raises(ModelIntegrityError, match=r"model\.onnx\.data has"):
        Engine.load(EngineSettings(model_dir=copy))


def test_spin_wait_off_reaches_the_sessions_and_changes_no_token(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ORTSERVE_SPIN_WAIT=false` (the suite's workers share the cores): onnxruntime's
    `session.intra_op.allow_spinning` 0 in the model's session options, the same tokens
    as with its threads spinning (the default)."""
    from ortserve.core import og_local

    on = EngineSettings(model_dir=tiny_model_dir, providers="cpu", spin_wait=True)
    monkeypatch.setenv("ORTSERVE_SPIN_WAIT", "false")
    off = EngineSettings(model_dir=tiny_model_dir, providers="cpu")
    assert on.spin_wait and not off.spin_wait
    entries = og_local.session_overlay(tiny_model_dir, off, 2, dedicated=False)
    assert entries["model"]["decoder"]["session_options"] == {
        "intra_op_num_threads": 2,
        og_local.NO_SPINNING: "0",
    }
    spinning = og_local.session_overlay(tiny_model_dir, on, 2, dedicated=True)
    assert og_local.NO_SPINNING not in spinning["model"]["decoder"]["session_options"]
    tokens = []
    for settings in (on, off):
        engine = Engine.load(settings)
        try:
            ids = engine.encode("Edge boards run a daemon")
            tokens.append(list(engine.stream_tokens(ids, SamplingOptions(24, 24))))
        finally:
            engine.close()
    assert tokens[0] == tokens[1] and tokens[0]
