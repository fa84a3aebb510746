"""Embeddings served (core.protocol.embeddings): the real all-MiniLM-L6-v2 beside a
generative model on the edge daemon (`ortserve serve MODEL all-minilm:l6-v2`), alone on
Cloud Functions and Lambda (one model a function), through the official openai and
ollama clients: the vectors are the model's own, every input shape and format, the
limits, the content filter, and the listings."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import ollama
import openai
import pytest

from ortserve.core.embedding import EmbeddingModel
from tests.functional.harness import API_KEY, AUTH, edge_server, gcf_server
from tests.functional.lambda_target import LambdaTarget, lambda_app
from tests.models import EMBEDDING_MODEL, all_minilm, baked

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply on Monday.", "A kitten rests."]
TINY = "ortserve/tiny-llama-random-weights"


@pytest.fixture(scope="module")
def minilm() -> Path:
    return all_minilm()


@pytest.fixture(scope="module")
def reference(minilm: Path) -> EmbeddingModel:
    return EmbeddingModel.load(minilm)


@pytest.fixture(scope="module")
def beside(
    tiny_model_dir: Path, minilm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The edge daemon serving the tiny generative model with MiniLM beside it, and a
    content filter that denies one word."""
    rules = tmp_path_factory.mktemp("filter") / "filter.toml"
    rules.write_text('[input]\ndeny = ["forbiddenword"]\n', encoding="utf-8")
    env = {"ORTSERVE_MODELS": str(minilm), "ORTSERVE_CONTENT_FILTER": str(rules)}
    with edge_server(tiny_model_dir, env) as base:
        yield base


def _near(a: object, b: object) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float32), np.asarray(b), atol=1e-5)


def test_the_openai_client_gets_the_models_own_vectors(
    beside: str, reference: EmbeddingModel
) -> None:
    client = openai.OpenAI(base_url=f"{beside}/v1", api_key=API_KEY, max_retries=0)
    want = reference.embed(reference.tokenize(TEXTS))
    reply = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS)
    assert reply.model == EMBEDDING_MODEL and [d.index for d in reply.data] == [0, 1, 2]
    for item, vector in zip(reply.data, want, strict=True):
        _near(item.embedding, vector)
    tokens = sum(len(ids) for ids in reference.tokenize(TEXTS))
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens
    # base64: each vector's float32 bytes, as the client decodes its own default.
    packed = client.embeddings.create(
        model=EMBEDDING_MODEL, input=TEXTS[0], encoding_format="base64"
    )
    raw = base64.b64decode(str(packed.data[0].embedding))
    _near(np.frombuffer(raw, dtype="<f4"), want[0])
    # A text's token ids (without the special tokens, as OpenAI's clients send them).
    ids = reference.tokenize([TEXTS[0]])[0][1:-1]
    by_ids = client.embeddings.create(model=EMBEDDING_MODEL, input=[ids, ids])
    _near(by_ids.data[1].embedding, want[0])
    # The model's own name and Ollama's short one name it too; so does none at all.
    for name in ("all-MiniLM-L6-v2", "all-minilm", ""):
        _near(client.embeddings.create(model=name, input=TEXTS[0]).data[0].embedding, want[0])
    assert client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS[0], dimensions=384)


def test_the_ollama_client_embeds_and_truncates_as_ollama_does(
    beside: str, reference: EmbeddingModel
) -> None:
    client = ollama.Client(host=beside, headers=AUTH)
    want = reference.embed(reference.tokenize(TEXTS))
    reply = client.embed(model="all-minilm", input=TEXTS)
    assert reply.model == EMBEDDING_MODEL and len(reply.embeddings) == 3
    _near(reply.embeddings, want)
    assert reply.prompt_eval_count == sum(len(t) for t in reference.tokenize(TEXTS))
    _near(client.embeddings(model="all-minilm", prompt=TEXTS[1]).embedding, want[1])
    long = " ".join(["word"] * 400)  # 402 tokens, over the model's 256
    cut = client.embed(model="all-minilm", input=long)  # truncate: true, Ollama's default
    _near(
        cut.embeddings[0], reference.embed([reference.truncate(reference.tokenize([long])[0])])[0]
    )
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="all-minilm", input=long, truncate=False)
    assert refused.value.status_code == 400 and "takes at most 256" in refused.value.error


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"input": " ".join(["word"] * 400)}, 400, "input.0 has 402 tokens"),
        ({"input": ["fine", ""]}, 400, "input.1: an empty string has no embedding"),
        ({"input": [[5, 999999]]}, 400, "token id 999999 is not in"),
        ({"input": ["x"] * 2049}, 400, "at most 2048 inputs"),
        ({"input": []}, 400, "input must be"),
        ({"input": "x", "dimensions": 128}, 400, "384-dimension vectors"),
        ({"input": "x", "model": "nope"}, 404, "this server has 'all-minilm:l6-v2'"),
        ({"input": "x", "model": TINY}, 400, "does not make embeddings"),
        ({"input": "say forbiddenword"}, 400, "content filter"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ],
)
def test_what_cannot_be_embedded_is_refused_in_words(
    beside: str, body: dict[str, object], status: int, words: str
) -> None:
    import httpx

    payload = {"model": EMBEDDING_MODEL, **body}
    reply = httpx.post(f"{beside}/v1/embeddings", json=payload, headers=AUTH, timeout=60)
    assert reply.status_code == status, reply.text
    assert words in reply.json()["error"]["message"]


def test_the_listings_show_both_models_and_each_route_its_own(beside: str) -> None:
    client = openai.OpenAI(base_url=f"{beside}/v1", api_key=API_KEY, max_retries=0)
    ids = [m.id for m in client.models.list()]
    assert ids == [TINY, EMBEDDING_MODEL]
    card = client.models.retrieve(EMBEDDING_MODEL)
    assert card.model_extra == {"max_model_len": 256}  # no token limit, no sampling
    local = ollama.Client(host=beside, headers=AUTH)
    assert [m.model for m in local.list().models] == [TINY, EMBEDDING_MODEL]
    shown = local.show("all-minilm")
    assert shown.capabilities == ["embedding"]
    assert (shown.modelinfo or {})["onnx.embedding_length"] == 384
    assert EMBEDDING_MODEL in [m.model for m in local.ps().models]  # loaded by now
    # The generative model still generates; the embedding model's name does not.
    chat = client.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert chat.choices[0].message is not None
    import httpx

    ready = httpx.get(f"{beside}/readyz", headers=AUTH, timeout=10).json()
    tiny, beside_model = ready["models"]
    assert beside_model["status"] == "ready" and beside_model["kind"] == "embedding"
    assert tiny["model"] == TINY and beside_model["expires_at"]  # ORTSERVE_MODEL_KEEP_ALIVE
    metrics = httpx.get(f"{beside}/metrics", headers=AUTH, timeout=10).text
    assert "ortserve_embedded_tokens_total" in metrics


def test_an_embedding_model_alone_on_cloud_functions(reference: EmbeddingModel) -> None:
    """One model a function: the gcf bundle of the embedding model serves embeddings and
    says, in words, that it generates nothing."""
    bundle = baked(EMBEDDING_MODEL, target="gcf", precision=None)
    with gcf_server(bundle) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        reply = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS[:1])
        _near(reply.data[0].embedding, reference.embed(reference.tokenize(TEXTS[:1]))[0])
        assert [m.id for m in client.models.list()] == [EMBEDDING_MODEL]
        with pytest.raises(openai.BadRequestError, match="is an embedding model"):
            client.chat.completions.create(
                model=EMBEDDING_MODEL, messages=[{"role": "user", "content": "Hi"}]
            )


def test_an_embedding_model_alone_on_lambda(minilm: Path, reference: EmbeddingModel) -> None:
    app = lambda_app(minilm)
    target = LambdaTarget(app.handle)
    reply = target.call("POST", "/api/embed", {"model": "all-minilm", "input": TEXTS[2]})
    assert reply.status == 200, reply.body
    _near(reply.json()["embeddings"][0], reference.embed(reference.tokenize(TEXTS[2:]))[0])
    packed = target.call(
        "POST", "/v1/embeddings", {"input": TEXTS[2], "encoding_format": "base64"}
    ).json()
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    _near(vector, reference.embed(reference.tokenize(TEXTS[2:]))[0])
    ready = target.call("GET", "/readyz").json()
    assert ready["status"] == "ready" and json.dumps(ready["embedding"])


def test_a_blank_name_is_the_embedding_model_and_without_one_a_404(
    beside: str, tiny_model_dir: Path
) -> None:
    """A blank `model` means the one embedding model, as no name does; a server with no
    embedding model answers 404 (it has none), not the chat model's 400."""
    import httpx

    body = {"model": " ", "input": "a cat"}
    reply = httpx.post(f"{beside}/api/embed", json=body, headers=AUTH, timeout=60)
    assert reply.status_code == 200 and reply.json()["model"] == EMBEDDING_MODEL
    with edge_server(tiny_model_dir) as alone:
        body = {"model": "\x0b", "input": "x"}
        missing = httpx.post(f"{alone}/api/embed", json=body, headers=AUTH, timeout=60)
        assert missing.status_code == 404, missing.text
        assert "no embedding model" in missing.json()["error"]
