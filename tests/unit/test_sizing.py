"""The memory formula every generated limit comes from (core.sizing), and where the
targets put it: the Lambda MemorySize (samconfig.toml) and the edge unit's MemoryMax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.package_edge import unit_memory_max, with_memory_max
from ortserve.bake.package_lambda import samconfig
from ortserve.core.sizing import memory_for

SMOLLM2_135M: dict[str, Any] = {
    "context_length": 8192,
    "vocab_size": 49152,
    "decoder": {"num_hidden_layers": 30, "num_key_value_heads": 3, "head_size": 64},
}
QWEN25_05B: dict[str, Any] = {
    "context_length": 32768,
    "vocab_size": 151936,
    "decoder": {"num_hidden_layers": 24, "num_key_value_heads": 2, "head_size": 64},
}


def test_the_terms_of_smollm2_135m() -> None:
    terms = memory_for(150 << 20, SMOLLM2_135M, sequences=4, chunk=256, cache_slots=1)
    assert terms.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4  # 45 KiB a token, fp32
    assert terms.runtime_mib == 256
    assert terms.model_mib == 188  # 1.25 x 150 MiB
    assert terms.kv_mib == 720  # 4 sequences x 4,096 tokens x 45 KiB
    assert terms.parts_mib == 288  # 4 x 1.5 x 256 tokens x 49,152 x 4 B
    assert terms.cache_mib == 180 + 12  # one slot: 4,096 tokens, 64 positions of logits
    assert terms.reload_mib == 0
    assert terms.kept_mib == 16  # the Responses API's stored conversations, at most
    assert terms.total_mib == 256 + 188 + 720 + 288 + 192 + 16
    # The context (8,192) is longer than a sequence's room: prompts and new tokens are
    # capped to fit (the default limit, the context, would not).
    assert (terms.tokens_per_sequence, terms.max_prompt_tokens) == (4096, 4096 - 512)
    assert terms.max_new_tokens == 512


def test_the_vocabulary_and_the_chunk_size_the_parts() -> None:
    qwen = memory_for(500 << 20, QWEN25_05B, sequences=4, chunk=256)
    assert qwen.parts_mib == 891  # 151,936 tokens: 3.1 x SmolLM2's part
    half = memory_for(500 << 20, QWEN25_05B, sequences=4, chunk=128)
    assert half.parts_mib == 446
    assert qwen.total_mib - half.total_mib == 445


def test_a_batchs_one_pass_holds_its_activations_where_they_outweigh_the_parts() -> None:
    # Qwen2.5-Coder-1.5B's shape: a 2,048-token batch pass measured +420 MiB there.
    qwen_15b = {**QWEN25_05B, "decoder": {**QWEN25_05B["decoder"], "hidden_size": 1536}}
    batching = memory_for(1500 << 20, qwen_15b, sequences=4, engine_process=True)
    assert batching.parts_mib == 480  # 160 B x 1,536 x 2,048 tokens, above 4 parts' 223
    alone = memory_for(1500 << 20, qwen_15b, sequences=1, engine_process=True)
    assert alone.parts_mib == 223  # no batches
    # og in the serving process (Cloud Functions): batches stay within 4 parts.
    assert memory_for(1500 << 20, qwen_15b, sequences=4).parts_mib == 223
    small = {**SMOLLM2_135M, "decoder": {**SMOLLM2_135M["decoder"], "hidden_size": 576}}
    smollm = memory_for(150 << 20, small, sequences=4, engine_process=True)
    assert smollm.parts_mib == 180  # above 4 parts' 72


def test_a_reload_has_room_for_a_second_model_and_its_cache() -> None:
    alone = memory_for(150 << 20, SMOLLM2_135M, sequences=4)
    both = memory_for(150 << 20, SMOLLM2_135M, sequences=4, reloads=True)
    assert both.reload_mib == alone.model_mib + alone.cache_mib
    assert both.total_mib == alone.total_mib + both.reload_mib


def test_a_short_context_needs_no_prompt_cap() -> None:
    short = {**SMOLLM2_135M, "context_length": 2048}
    terms = memory_for(150 << 20, short, sequences=1)
    # Prompt + new tokens never pass the context, the sequence's room: no cap either.
    assert (terms.tokens_per_sequence, terms.max_prompt_tokens, terms.max_new_tokens) == (
        2048,
        0,
        0,
    )


def test_the_edge_unit_gets_the_formulas_memory_max() -> None:
    terms = memory_for(150 << 20, SMOLLM2_135M, sequences=4, reloads=True)
    limit = unit_memory_max(terms)
    assert limit.endswith("M") and int(limit[:-1]) % 64 == 0
    assert 0 <= int(limit[:-1]) - terms.total_mib < 64
    unit = "[Service]\nMemoryMax=2G\nTasksMax=64\n"
    assert with_memory_max(unit, limit).splitlines()[-2:] == [f"MemoryMax={limit}", "TasksMax=64"]
    with pytest.raises(BakeError, match="changed shape"):
        with_memory_max("[Service]\n", limit)


def test_samconfig_deploys_the_memory_size() -> None:
    text = samconfig("arm64", 4096)
    assert text.count('parameter_overrides = "Architecture=arm64 MemorySize=4096"') == 2


def test_the_shipped_settings_keep_requests_in_the_declared_room() -> None:
    """#35 item 8: where the context is longer than a sequence's room, the edge bundle's
    settings file and the Lambda images set the caps (active, not commented), so that the
    declared memory holds with the settings as shipped; a short context ships none."""
    from ortserve.bake.package_edge import with_caps
    from ortserve.bake.package_lambda import DOCKERFILES, dockerfile_with_caps
    from ortserve.bake.packaging_common import package_dir
    from ortserve.core.sizing import shipped_caps

    edge = memory_for(150 << 20, SMOLLM2_135M, sequences=4, reloads=True)
    caps = {"ORTSERVE_MAX_PROMPT_TOKENS": "3584", "ORTSERVE_MAX_NEW_TOKENS": "512"}
    assert shipped_caps(edge) == caps
    settings = (package_dir("ortserve.edge") / "ortserve.env").read_text(encoding="utf-8")
    active = dict(
        line.split("=", 1)
        for line in with_caps(settings, edge).splitlines()
        if line.startswith("ORTSERVE_")
    )
    assert active == caps
    lambda_terms = memory_for(150 << 20, SMOLLM2_135M, sequences=1)
    for name in DOCKERFILES:
        text = (package_dir("ortserve.functions") / "aws" / name).read_text(encoding="utf-8")
        baked = dockerfile_with_caps(text, lambda_terms)
        assert "ENV ORTSERVE_MAX_PROMPT_TOKENS=3584 \\\n    ORTSERVE_MAX_NEW_TOKENS=512\n" in baked
        assert baked.index("ORTSERVE_MAX_PROMPT_TOKENS") < baked.index(
            "\nCMD" if "CMD" in text else "\nENTRYPOINT"
        )
    short = dict(SMOLLM2_135M, context_length=2048)
    assert shipped_caps(memory_for(150 << 20, short, sequences=4)) == {}
    assert with_caps(settings, memory_for(150 << 20, short, sequences=4)) == settings


def test_the_cloud_functions_bundle_reads_its_caps_from_sizing_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#35 item 8 on Cloud Functions: `sizing.json` (written by the bake, with the caps
    `shipped_caps` gives) is where the function's limits default from; its environment
    still overrides them; no file or no caps: no limit."""
    import json

    from ortserve.core.sizing import write_record
    from ortserve.functions.gcp import settings as gcf

    terms = memory_for(150 << 20, SMOLLM2_135M, sequences=4)
    write_record(tmp_path / "sizing.json", terms, memory_mib=terms.total_mib)
    record = json.loads((tmp_path / "sizing.json").read_text(encoding="utf-8"))
    assert record["settings"] == {
        "ORTSERVE_MAX_PROMPT_TOKENS": "3584",
        "ORTSERVE_MAX_NEW_TOKENS": "512",
    }
    assert gcf.shipped("ORTSERVE_MAX_PROMPT_TOKENS", tmp_path) == 3584
    assert gcf.shipped("ORTSERVE_MAX_NEW_TOKENS", tmp_path) == 512
    assert gcf.shipped("ORTSERVE_MAX_NEW_TOKENS", tmp_path / "nowhere") == 0
    monkeypatch.setattr(gcf, "BUNDLE_ROOT", tmp_path)
    monkeypatch.setattr(gcf.shipped, "__defaults__", (tmp_path,))
    loaded = gcf.GcfSettings(model_dir=tmp_path)
    assert (loaded.max_prompt_tokens, loaded.max_new_tokens) == (3584, 512)
    monkeypatch.setenv("ORTSERVE_MAX_PROMPT_TOKENS", "7000")
    assert gcf.GcfSettings(model_dir=tmp_path).max_prompt_tokens == 7000


def test_the_engine_process_adds_its_runtime_and_ships_its_ceiling() -> None:
    """#37: the edge daemon and the Cloud Run image run og in a process of its own (a
    second runtime, a reload's new engine too), and the engine's ceiling (RLIMIT_DATA) is
    the whole declared memory, set in the edge bundle's settings file."""
    from ortserve.bake.package_edge import with_caps
    from ortserve.bake.packaging_common import package_dir
    from ortserve.core.sizing import ENGINE_PROCESS_MIB, engine_ceiling

    one = memory_for(150 << 20, SMOLLM2_135M, sequences=4, reloads=True)
    two = memory_for(150 << 20, SMOLLM2_135M, sequences=4, reloads=True, engine_process=True)
    assert (one.engine_mib, two.engine_mib) == (0, ENGINE_PROCESS_MIB)
    assert two.reload_mib == one.reload_mib + ENGINE_PROCESS_MIB
    assert two.total_mib == one.total_mib + 2 * ENGINE_PROCESS_MIB
    assert engine_ceiling(one) == {}
    assert engine_ceiling(two) == {"ORTSERVE_ENGINE_MEMORY_MB": str(two.total_mib)}
    settings = (package_dir("ortserve.edge") / "ortserve.env").read_text(encoding="utf-8")
    active = dict(
        line.split("=", 1)
        for line in with_caps(settings, two).splitlines()
        if line.startswith("ORTSERVE_")
    )
    assert active == {
        "ORTSERVE_MAX_PROMPT_TOKENS": "3584",
        "ORTSERVE_MAX_NEW_TOKENS": "512",
        "ORTSERVE_ENGINE_MEMORY_MB": str(two.total_mib),
    }
