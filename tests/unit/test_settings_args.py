"""Flags derived from the settings (core.settings_args; #28 item 9)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ortserve.core.settings import EngineSettings, ServerSettings
from ortserve.core.settings_args import add_setting_argument, attribute_docs, env_name
from ortserve.edge.settings import EdgeSettings


@pytest.mark.parametrize("settings", [EngineSettings, ServerSettings, EdgeSettings])
def test_every_setting_is_described_once_in_its_class(settings: type[EngineSettings]) -> None:
    docs = attribute_docs(settings)
    assert set(settings.model_fields) <= set(docs), set(settings.model_fields) - set(docs)
    assert all(text.strip() for text in docs.values())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_setting_argument(parser, EdgeSettings, "port")
    add_setting_argument(parser, EdgeSettings, "log_format")
    add_setting_argument(parser, EdgeSettings, "wait_for_model")
    add_setting_argument(parser, EdgeSettings, "model_dir")
    return parser


def test_a_flag_takes_the_settings_type_bounds_and_choices() -> None:
    parser = _parser()
    args = parser.parse_args(["--port", "9000", "--log-format", "json", "--model-dir", "m"])
    assert (args.port, args.log_format, args.model_dir) == (9000, "json", Path("m"))
    assert args.wait_for_model is None  # not given: the environment, then the default
    assert parser.parse_args(["--wait-for-model"]).wait_for_model is True
    with pytest.raises(argparse.ArgumentError, match="less than or equal to 65535"):
        parser.parse_args(["--port", "70000"])
    with pytest.raises(argparse.ArgumentError, match="should be 'auto', 'json' or 'text'"):
        parser.parse_args(["--log-format", "xml"])
    # What the flags give is what the settings take.
    given = vars(parser.parse_args(["--port", "9000"]))
    settings = EdgeSettings(**{k: v for k, v in given.items() if v is not None})
    assert settings.port == 9000


def test_the_help_is_the_settings_own_with_its_variable_and_default() -> None:
    helps = {a.dest: a.help or "" for a in _parser()._actions}
    assert helps["port"] == "port the edge daemon listens on (ORTSERVE_PORT, default 8000)"
    assert "ORTSERVE_WAIT_FOR_MODEL" in helps["wait_for_model"]
    assert helps["log_format"].count("ORTSERVE_LOG_FORMAT") == 1  # said once
    assert env_name(EdgeSettings, "watchdog_usec") == "WATCHDOG_USEC"  # systemd's own name
