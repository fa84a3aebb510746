"""The prompt cache for sampled requests (issue 54), through the OpenAI, Ollama and
Responses routes: at Qwen2.5-Coder's own sampling defaults (temperature 0.7, top-p 0.8,
top-k 20, repetition penalty 1.1) a second chat turn and a second conversation with the
same system prompt reuse the kept prompt, with one slot and with several, in this process
and in the edge daemon's engine process (where the tokens are picked)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.functional.harness import Target
from tests.functional.targets import open_target

SYSTEM = "You answer questions about edge boards, briefly and politely. " * 14
QWEN = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
MODEL = "ortserve/tiny-llama-random-weights"


@pytest.fixture(scope="module", params=[("core", 1), ("edge", 4)], ids=["core-1", "edge-4"])
def target(
    request: pytest.FixtureRequest, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[Target]:
    kind, slots = request.param
    with open_target(kind, tiny_model_dir, tiny_gcf_bundle, prompt_cache_slots=slots) as opened:
        yield opened


def _post(target: Target, path: str, body: dict[str, Any]) -> Any:
    reply = target.call("POST", path, body)
    assert reply.status == 200, reply.body
    return reply.json()


def _openai(target: Target, messages: list[dict[str, str]]) -> tuple[str, int]:
    body = {"messages": messages, "max_tokens": 6, **QWEN}
    answer = _post(target, "/v1/chat/completions", body)
    cached: int = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return answer["choices"][0]["message"]["content"], cached


def _ollama(target: Target, messages: list[dict[str, str]]) -> tuple[str, int]:
    options = {**QWEN, "num_predict": 6}
    options["repeat_penalty"] = options.pop("repetition_penalty")
    body = {"model": MODEL, "messages": messages, "stream": False, "options": options}
    answer = _post(target, "/api/chat", body)
    assert answer["prompt_eval_count"] >= answer.get("prompt_eval_cached_count", 0)
    return answer["message"]["content"], answer.get("prompt_eval_cached_count", 0)


def _responses(target: Target, messages: list[dict[str, str]]) -> tuple[str, int]:
    body = {
        "instructions": messages[0]["content"],
        "input": [{"role": m["role"], "content": m["content"]} for m in messages[1:]],
        "max_output_tokens": 6,
        "temperature": QWEN["temperature"],
        "top_p": QWEN["top_p"],
        "store": False,
    }
    answer = _post(target, "/v1/responses", body)
    text = "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    cached: int = answer["usage"]["input_tokens_details"]["cached_tokens"]
    return text, cached


@pytest.mark.parametrize(
    "route", [_openai, _ollama, _responses], ids=["openai", "ollama", "responses"]
)
def test_sampled_chats_reuse_their_turns_and_a_shared_system_prompt(
    target: Target, route: Any
) -> None:
    system = {"role": "system", "content": f"{route.__name__}: {SYSTEM}"}
    ann = [system, {"role": "user", "content": "Hello, I am Ann."}]
    answer, cached = route(target, ann)
    assert cached < 16  # at most the chat template's first tokens (a full cache's last entry)
    # Her second turn reuses the whole first prompt.
    ann += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
    _, cached = route(target, ann)
    assert cached > 0
    first_turn = cached
    # Another conversation with the same system prompt reuses it.
    _, cached = route(target, [system, {"role": "user", "content": "Hello, I am Bob."}])
    assert 0 < cached < first_turn + 8
