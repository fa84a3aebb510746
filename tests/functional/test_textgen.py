"""The Python API (`from ortserve import TextGenerator`) over the engine the server uses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ortserve import OrtServeError, TextGenerator
from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from ortserve.store import record
from tests.functional.harness import InProcess


def test_generate_stream_and_chat_match_the_http_api(tiny_model_dir: Path) -> None:
    gen = TextGenerator(tiny_model_dir, providers="cpu")
    assert gen.model_name == "ortserve/tiny-llama-random-weights"
    result = gen.generate("Hello there", max_new_tokens=24)
    assert set(result) == {
        "generated_text",
        "tokens_generated",
        "prompt_tokens",
        "finish_reason",
        "time_to_first_token_s",
        "tokens_per_s",
    }
    settings = ServerSettings(model_dir=tiny_model_dir, providers="cpu")
    state = ModelState(settings)
    state.load()
    http = InProcess(Api(state, settings)).call(
        "POST", "/generate", {"prompt": "Hello there", "max_new_tokens": 24}
    )
    assert result["generated_text"] == http.json()["generated_text"]
    assert result["tokens_generated"] == http.json()["tokens_generated"]

    pairs = list(gen.stream_generate("Hello there", max_new_tokens=24))
    assert all(meta == {"finished": False} for _, meta in pairs[:-1])
    assert "".join(chunk for chunk, _ in pairs) == result["generated_text"]
    final = pairs[-1][1]
    assert final["finished"] is True and final["tokens_generated"] == result["tokens_generated"]

    messages = [{"role": "user", "content": "Hi"}]
    reply = gen.chat(messages, max_new_tokens=8)
    streamed = list(gen.stream_chat(messages, max_new_tokens=8))
    assert "".join(c for c, _ in streamed) == reply["generated_text"]
    stopped = gen.generate("Hello there", max_new_tokens=24, stop=[result["generated_text"][5:8]])
    assert stopped["finish_reason"] == "stop"

    sampled = [
        gen.generate("Hello there", max_new_tokens=8, temperature=0.9, top_p=0.9, top_k=20, seed=7)
        for _ in range(2)
    ]
    assert sampled[0]["generated_text"] == sampled[1]["generated_text"]  # same seed, same text
    with pytest.raises(
        TypeError, match=r"generate\(\) got an unexpected keyword argument 'num_beams'"
    ):
        gen.generate("Hi", num_beams=2)  # type: ignore[call-arg]  # SamplingOptions', not ours
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        gen.stream_chat(messages, x=1)  # type: ignore[call-arg]  # at the call, not on next()


def test_the_default_model_is_the_stores_only_one_as_serve_picks_it(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORTSERVE_MODEL_DIR", str(tmp_path / "none"))
    with pytest.raises(OrtServeError, match=r"the store is empty; pass `TextGenerator\(NAME_OR"):
        TextGenerator()
    entry = tmp_path / "home" / "models" / "tiny-edge-x86_64-0"
    shutil.copytree(tiny_model_dir, entry / "model")
    record(entry, {"source": "builtin:tiny-llama", "target": "edge-x86_64"})
    assert TextGenerator(providers="cpu").engine.manifest.model_name == (
        "ortserve/tiny-llama-random-weights"
    )
    other = tmp_path / "home" / "models" / "tiny-cuda-0"
    shutil.copytree(tiny_model_dir, other / "model")
    record(other, {"source": "builtin:tiny-llama", "target": "cuda"})
    with pytest.raises(
        OrtServeError,
        # #53 item 3: shown as a Python user names one, not as a command.
        match=r"the store holds 2: name one \(tiny-llama, tiny-llama:cuda\), "
        r"e\.g\. `TextGenerator\('tiny-llama'\)`$",
    ):
        TextGenerator()
