"""The Responses API's kept conversations (previous_response_id): an LRU per tenant,
bounded in entries and in bytes, and counted in the memory formula."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ortserve.core.errors import InvalidRequestError
from ortserve.core.protocol.bodies import parse
from ortserve.core.protocol.responses import (
    KEPT,
    KEPT_RESPONSE_BYTES,
    KEPT_RESPONSES,
    ResponsesBody,
    ResponsesReply,
    _Kept,
    conversation_bytes,
)
from ortserve.core.protocol.serving import Served
from ortserve.core.sizing import MIB, memory_for

A, B = "tenant-a", "tenant-b"


def _turn(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_the_least_recently_used_response_goes_first() -> None:
    kept = _Kept(KEPT_RESPONSES)
    for i in range(KEPT_RESPONSES):
        kept.put(A, f"resp_{i}", _turn(str(i)))
    assert kept.get(A, "resp_0") == tuple(_turn("0"))  # now the most recent
    kept.put(A, "resp_new", [])
    assert kept.get(A, "resp_1") is None  # the least recently used went
    assert kept.get(A, "resp_0") is not None and kept.get(A, "resp_new") == ()


def test_a_tenant_finds_only_its_own_responses() -> None:
    kept = _Kept(KEPT_RESPONSES)
    kept.put(A, "resp_a", _turn("A's secret"))
    assert kept.get(B, "resp_a") is None  # as an id that never was
    assert kept.get(B, "resp_a") == kept.get(B, "resp_never")
    assert kept.get(A, "resp_a") == tuple(_turn("A's secret"))
    # The same id under another tenant is another entry: B cannot overwrite A's.
    kept.put(B, "resp_a", _turn("B's"))
    assert kept.get(A, "resp_a") == tuple(_turn("A's secret"))
    assert kept.get(B, "resp_a") == tuple(_turn("B's"))


def test_another_tenants_lookup_does_not_refresh_an_entry() -> None:
    kept = _Kept(2)
    kept.put(A, "resp_1", _turn("1"))
    kept.put(A, "resp_2", _turn("2"))
    assert kept.get(B, "resp_1") is None  # does not make resp_1 A's most recent
    kept.put(A, "resp_3", _turn("3"))
    assert kept.get(A, "resp_1") is None and kept.get(A, "resp_2") is not None


def test_the_store_is_bounded_in_bytes_oldest_first() -> None:
    one = conversation_bytes(tuple(_turn("x" * 100_000)))
    kept = _Kept(KEPT_RESPONSES, max_bytes=3 * one)
    for i in range(3):
        assert kept.put(A, f"resp_{i}", _turn("x" * 100_000))
    assert kept.bytes == 3 * one
    kept.put(B, "resp_b", _turn("y" * 100_000))  # shared capacity: A's oldest goes
    assert kept.get(A, "resp_0") is None
    assert [kept.get(A, f"resp_{i}") is not None for i in (1, 2)] == [True, True]
    assert kept.get(B, "resp_b") is not None and kept.bytes == 3 * one


def test_a_response_larger_than_the_bound_is_not_kept() -> None:
    kept = _Kept(KEPT_RESPONSES, max_bytes=1 << 20)
    kept.put(A, "resp_small", _turn("small"))
    assert not kept.put(A, "resp_big", _turn("x" * (1 << 20)))
    assert kept.get(A, "resp_big") is None
    assert kept.get(A, "resp_small") is not None  # nothing was evicted for it


def test_bytes_count_the_memory_a_string_takes() -> None:
    """One character past Latin-1 makes CPython store every character in 4 bytes: the
    count follows memory, not the text's UTF-8 length."""
    ascii_ = conversation_bytes(_turn("x" * 100_000))
    wide = conversation_bytes(_turn("x" * 99_999 + "\U0001f600"))
    assert ascii_ > 100_000 and wide > 4 * 99_999


def test_a_chain_counts_each_conversation_whole() -> None:
    """A conversation that continues a kept one shares its turns in memory but is counted
    whole: a chain of 1 MB calls can never hold more than the bound."""
    arguments = "x" * (1 << 20)
    kept = _Kept(KEPT_RESPONSES, max_bytes=16 << 20)
    conversation: list[dict[str, Any]] = []
    for i in range(32):
        call = {"id": f"call_{i}", "type": "function", "function": {"arguments": arguments}}
        conversation = [*conversation, {"role": "assistant", "content": "", "tool_calls": [call]}]
        kept.put(A, f"resp_{i}", conversation)
        assert kept.bytes <= 16 << 20
    assert kept.get(A, "resp_31") is None  # 32 MB alone: not kept
    assert kept.get(A, "resp_0") is None  # the oldest went first


# -- through the body --------------------------------------------------------------------

_SERVED = Served(
    model="m", digest="d", created_at="2026-01-01", max_new_tokens=16, default_new_tokens=16
)


def _body(tenant: str, **fields: Any) -> ResponsesBody:
    body = parse(ResponsesBody, json.dumps(fields).encode())
    body.sent_by(tenant)
    return body


def test_previous_response_id_of_another_tenant_is_refused_as_an_unknown_one() -> None:
    KEPT.put(A, "resp_of_a", [*_turn("A's words"), {"role": "assistant", "content": "ok"}])
    mine = _body(A, input="more", previous_response_id="resp_of_a").conversation()
    assert mine[0] == {"role": "user", "content": "A's words"}
    errors = []
    for rid in ("resp_of_a", "resp_never_was"):
        with pytest.raises(InvalidRequestError) as caught:
            _body(B, input="more", previous_response_id=rid).conversation()
        errors.append((caught.value.status, caught.value.param, caught.value.message))
    assert errors[0] == (
        errors[1][0],
        errors[1][1],
        errors[1][2].replace("resp_never_was", "resp_of_a"),
    )
    assert "send the whole conversation" in errors[0][2]


def test_a_continued_call_does_not_change_the_kept_conversation() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    KEPT.put(
        A, "resp_calls", [*_turn("go"), {"role": "assistant", "content": "", "tool_calls": [call]}]
    )
    item = {"type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}"}
    body = _body(A, input=[item], previous_response_id="resp_calls")
    assert len(body.conversation()[-1]["tool_calls"]) == 2
    kept = KEPT.get(A, "resp_calls")
    assert kept is not None and len(kept[-1]["tool_calls"]) == 1


def test_the_reply_keeps_the_answer_as_its_tenants() -> None:
    body = _body(B, input="hello")
    reply = body.reply("req", _SERVED)
    assert isinstance(reply, ResponsesReply) and reply.tenant == B


# -- the memory formula ------------------------------------------------------------------


def test_the_memory_formula_counts_the_kept_responses() -> None:
    config = {
        "context_length": 2048,
        "vocab_size": 1000,
        "decoder": {"num_hidden_layers": 2, "num_key_value_heads": 2, "head_size": 64},
    }
    terms = memory_for(10 << 20, config, sequences=1)
    assert terms.kept_mib == KEPT_RESPONSE_BYTES // MIB == 16
    others = (
        terms.runtime_mib
        + terms.engine_mib
        + terms.model_mib
        + terms.kv_mib
        + terms.parts_mib
        + terms.cache_mib
        + terms.reload_mib
    )
    assert terms.total_mib == others + terms.kept_mib
    assert "kept" in terms.record()["formula"]
    # Once, not per reload: the kept conversations live in the serving process.
    assert memory_for(10 << 20, config, sequences=1, reloads=True).kept_mib == 16
