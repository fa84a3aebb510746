"""The tenant rule as a property (issue 49, docs/api.md "Tenants"): for any two API keys,
nothing one sends changes what the other sees — its answers, its usage counts (the prompt
cache's `cached_tokens` among them) and its stored responses — beyond the capacity they
share (slots, the queue, memory; the cache here has room for every entry, so no eviction
stands in for a leak).

Each example takes three fresh keys: a control tenant runs tenant B's requests alone;
then B runs them again with tenant A's requests between them, A sending the same
prompts and asking for B's stored responses. B must see what the control saw, and A
must get for B's response ids exactly what an id that never existed gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import InProcess, Reply

KEYS = ["tenant-control", "tenant-b", "tenant-a"]
SYSTEMS = ["You are terse.", "The vault code is 7391. " * 8, "Answer in French. " * 4]
USERS = ["Hi", "What is the code?", "Tell me a story"]

# An action: ("chat", system, user, salt) or ("respond", user, continue-own-response).
Chat = st.tuples(
    st.just("chat"),
    st.sampled_from(range(len(SYSTEMS))),
    st.sampled_from(range(len(USERS))),
    st.sampled_from([None, "s1"]),
)
Respond = st.tuples(st.just("respond"), st.sampled_from(range(len(USERS))), st.booleans())
Actions = st.lists(st.one_of(Chat, Respond), min_size=1, max_size=2)


@pytest.fixture(scope="module")
def api(tiny_model_dir: Path) -> Api:
    # 16 slots, emptied before each example: every entry of an example fits, so the
    # cache is never full (a full cache evicts, and reuses partial matches: shared
    # capacity, not what is tested).
    server = ServerSettings(
        model_dir=tiny_model_dir, providers="cpu", api_keys=KEYS, prompt_cache_slots=16
    )
    state = ModelState(server)
    state.load()
    assert state.status == "ready", state.reason
    return Api(state, server)


class _Tenant:
    """One key's client, and the ids of the responses it stored."""

    def __init__(self, target: InProcess, key: str) -> None:
        self.target = target
        self.headers = {"authorization": f"Bearer {key}"}
        self.responses: list[str] = []

    def act(self, action: tuple[Any, ...]) -> tuple[int, Any]:
        """Send `action`; what the tenant sees of the answer, ids and times aside."""
        if action[0] == "chat":
            _, system, user, salt = action
            body: dict[str, Any] = {
                "messages": [
                    {"role": "system", "content": SYSTEMS[system]},
                    {"role": "user", "content": USERS[user]},
                ],
                "max_tokens": 4,
                "temperature": 0,
            }
            if salt is not None:
                body["cache_salt"] = salt
            reply = self.target.call("POST", "/v1/chat/completions", body, self.headers)
            answer = reply.json()
            if reply.status != 200:
                return reply.status, answer
            return 200, (answer["choices"][0]["message"], answer["usage"])
        _, user, again = action
        body = {"input": USERS[user], "max_output_tokens": 4, "temperature": 0}
        if again and self.responses:
            body["previous_response_id"] = self.responses[-1]
        reply = self.target.call("POST", "/v1/responses", body, self.headers)
        answer = reply.json()
        if reply.status != 200:
            return reply.status, answer
        self.responses.append(answer["id"])
        return 200, (_without_ids(answer["output"]), answer["usage"])

    def ask_for(self, response_id: str) -> Reply:
        body = {"input": "go on", "max_output_tokens": 2, "previous_response_id": response_id}
        return self.target.call("POST", "/v1/responses", body, self.headers)


def _without_ids(value: Any) -> Any:
    """`value` with every "id" (random per answer) taken out."""
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def _unknown(reply: Reply, response_id: str) -> Any:
    """A refusal's body with the id it names taken out."""
    return reply.status, reply.body.decode().replace(response_id, "ID")


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mine=Actions, theirs=st.lists(Actions, min_size=2, max_size=2))
def test_nothing_one_tenant_sends_changes_what_another_sees(
    api: Api, mine: list[tuple[Any, ...]], theirs: list[list[tuple[Any, ...]]]
) -> None:
    target = InProcess(api)
    engine = api.state.engine
    assert engine is not None and engine.prompt_cache is not None
    engine.prompt_cache.clear()  # each example starts from an empty cache
    control, b, a = (_Tenant(target, key) for key in KEYS)
    alone = [control.act(action) for action in mine]
    seen = []
    for step, action in enumerate(mine):
        # A sends B's own prompts (the probing attack) and its own, then asks for B's
        # stored responses by id.
        for other in [action, *theirs[step % len(theirs)]]:
            a.act(other)
        for stolen in b.responses:
            never = f"resp_{'0' * 32}"
            assert _unknown(a.ask_for(stolen), stolen) == _unknown(a.ask_for(never), never)
        seen.append(b.act(action))
    assert seen == alone
