"""Long prompts (issues 23 and 35) on the real edge daemon: the declared concurrency of
the longest prompts allowed, all prefilling at once, peaks under the memory each target
declares (Cloud Run's sizing, the edge unit's MemoryMax). Apart from test_long_prompts.py
so that pytest-xdist (`--dist loadfile`) can run them beside it.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests import models
from tests.functional.long_prompt_kit import long_prompt, status_mib
from tests.functional.test_edge_daemon import start  # noqa: F401 (the daemon fixture)


@pytest.mark.slow
def test_the_declared_concurrency_of_longest_prompts_fits_the_declared_memory(
    start: Any,  # noqa: F811
) -> None:
    """The Cloud Run sizing of the 135M shape (`core.sizing`): its concurrency of prompts
    of the longest length it allows, each with room for the most new tokens, all
    prefilling at once, keep the process's peak RSS (VmHWM, load included) under the
    memory the bake declares."""
    from ortserve.bake.package_cloudrun import sizing
    from ortserve.core.sizing import MAX_NEW_TOKENS

    shape = models.shape_135m()
    size = sizing(shape)
    assert (size.max_prompt_tokens, size.max_new_tokens) == (4096 - MAX_NEW_TOKENS, MAX_NEW_TOKENS)
    daemon = start(
        shape,
        THREADS=str(size.cpu),
        MAX_BATCH=str(size.concurrency),
        MAX_PROMPT_TOKENS=str(size.max_prompt_tokens),
        MAX_NEW_TOKENS=str(size.max_new_tokens),
    )
    daemon.wait_for("READY=1")
    peak = _peak_of_longest_prompts(daemon, size.concurrency, size.max_prompt_tokens)
    assert peak <= size.memory_mib, (peak, size)


def _peak_of_longest_prompts(daemon: Any, count: int, prompt_tokens: int) -> float:
    """The daemon's peak RSS (VmHWM, MiB) once `count` streamed requests, each with the
    longest prompt allowed (`prompt_tokens`; different for each: no shared cache) and
    room for the most new tokens, all have their first token (their KV room and prefill
    are done). Batchable (no seed, no min_tokens), as most requests are."""
    from ortserve.core.sizing import MAX_NEW_TOKENS

    first_tokens = threading.Barrier(count + 1, timeout=900)
    counts: list[int] = []

    def ask(index: int) -> None:
        body = {
            "prompt": f"{index} " + long_prompt(prompt_tokens - 8),
            "max_tokens": MAX_NEW_TOKENS,
            "stream": True,
        }
        try:
            with (
                httpx.Client(base_url=daemon.url, timeout=900) as client,
                client.stream("POST", "/v1/completions", json=body) as reply,
            ):
                assert reply.status_code == 200, reply.read()
                next(reply.iter_lines())  # the first token
                counts.append(index)
                first_tokens.wait()
        except BaseException:
            first_tokens.abort()
            raise

    askers = [threading.Thread(target=ask, args=(i,)) for i in range(count)]
    for asker in askers:
        asker.start()
    first_tokens.wait()
    peak = status_mib(daemon.proc.pid, "VmHWM")
    for asker in askers:
        asker.join(60)
    assert len(counts) == count
    return peak


@pytest.mark.slow
def test_the_edge_bundles_shipped_settings_hold_its_memory_max(start: Any) -> None:  # noqa: F811
    """#35 item 8: the edge bundle's settings as shipped (its ortserve.env with the bake's
    caps, everything else default) on the 135M shape (an 8,192 context): prompts past the
    room the unit's MemoryMax counts are refused, and its sequences of the longest
    allowed prompts, all at once, peak (VmHWM) under MemoryMax."""
    from ortserve.bake.package_edge import unit_memory_max, with_caps
    from ortserve.bake.packaging_common import package_dir
    from ortserve.core.sizing import model_memory

    shape = models.shape_135m()
    terms = model_memory(shape, reloads=True)
    limit_mib = int(unit_memory_max(terms).removesuffix("M"))
    settings = (package_dir("ortserve.edge") / "ortserve.env").read_text(encoding="utf-8")
    shipped = dict(
        line.removeprefix("ORTSERVE_").split("=", 1)
        for line in with_caps(settings, terms).splitlines()
        if line.startswith("ORTSERVE_")
    )
    assert set(shipped) == {"MAX_PROMPT_TOKENS", "MAX_NEW_TOKENS"}
    daemon = start(shape, **shipped)
    daemon.wait_for("READY=1")
    too_long = daemon.http.post("/v1/completions", json={"prompt": long_prompt(8100)}, timeout=60)
    assert too_long.status_code == 400, too_long.text
    peak = _peak_of_longest_prompts(daemon, terms.sequences, int(shipped["MAX_PROMPT_TOKENS"]))
    assert peak <= limit_mib, (peak, limit_mib, terms)
