"""A request cannot forge a log line (#49 item 8a): a path or a field's name that holds a
newline, ESC, DEL, a C1 control or U+2028 is logged on one line, those characters
escaped, in the text format (the edge daemon's stderr, access lines included) and in the
JSON one; through the in-process API with the daemon's text formatter and through the
real daemon, unauthenticated."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ortserve.core.api import Api
from ortserve.core.http import Headers, Request
from ortserve.core.logs import JsonLog
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from ortserve.edge.logs import RequestLog, stderr_formatter
from tests.functional.test_edge_daemon import Daemon

STAMP = "2026-12-06T00:00:00.000Z"
FORGED = f"{STAMP} ERROR ortserve: FORGED"
# What a client sends: a newline, then a line as the daemon writes them.
FORGING_PATH = "/x%0a" + FORGED.replace(" ", "%20")
# Each control character a log reader or a terminal obeys, and how the log shows it.
CONTROLS = {
    "\n": "\\u000a",
    "\r": "\\u000d",
    "\x1b": "\\u001b",
    "\x7f": "\\u007f",
    "\x85": "\\u0085",
    "\u2028": "\\u2028",
}
RAW = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    """What the daemon's text format writes of the `ortserve` loggers (access lines too)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(stderr_formatter())
    logger = logging.getLogger("ortserve")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


def _api(tmp_path: Path, on_record: Any) -> Api:
    settings = ServerSettings(model_dir=tmp_path / "nowhere", providers="cpu", api_keys=["k"])
    state = ModelState(settings)
    state.load()
    return Api(state, settings, on_record=on_record)


def _lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.split("\n") if needle in line]


@pytest.mark.parametrize("char", list(CONTROLS), ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_in_process_a_forging_path_is_one_text_line_its_controls_escaped(
    tmp_path: Path, text_log: io.StringIO, char: str
) -> None:
    api = _api(tmp_path, RequestLog(True).record)
    path = f"/x{char}{FORGED}"
    assert api.handle(Request("GET", path)).status == 401  # no key: anyone can send it
    lines = _lines_with(text_log.getvalue(), "FORGED")
    assert len(lines) == 1, text_log.getvalue()
    line = lines[0]
    assert f"ortserve.access: GET /x{CONTROLS[char]}{FORGED} 401 " in line, line
    assert not RAW.search(line) and not line.startswith(STAMP)


def test_in_process_an_unknown_fields_name_is_escaped_in_text_and_json(
    tmp_path: Path, text_log: io.StringIO
) -> None:
    stdout = io.StringIO()
    json_records = RequestLog(False, stdout)
    text_records = RequestLog(True)

    def both(record: Any) -> None:
        json_records.record(record)
        text_records.record(record)

    settings = ServerSettings(model_dir=tmp_path / "nowhere", providers="cpu")
    api = Api(ModelState(settings), settings, on_record=both)
    name = f"a\n{FORGED}\x1b[2J\u2028"
    body = json.dumps({"prompt": "x", name: 1}).encode()
    reply = api.handle(Request("POST", "/generate", Headers(), body))
    assert reply.status == 400
    (line,) = _lines_with(text_log.getvalue(), "FORGED")
    assert f"unknown field a\\u000a{FORGED}\\u001b[2J\\u2028" in line, line
    assert not RAW.search(line)
    (record_line,) = stdout.getvalue().splitlines()
    assert not RAW.search(record_line)
    assert json.loads(record_line)["reason"].startswith(f"invalid_request: unknown field {name}")


def test_a_json_line_escapes_every_control_character() -> None:
    out = io.StringIO()
    value = "".join(CONTROLS) + "\x00\x9f\u2029\ud800"  # and a lone surrogate
    JsonLog(out).write("INFO", "m", route=value)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert not RAW.search(text[:-1])
    assert json.loads(text)["route"] == value


def test_through_the_edge_daemon_a_forging_path_is_one_escaped_line(tmp_path: Path) -> None:
    """The real daemon, text logs, API keys set, a request without a key (no model is
    needed: the daemon answers while it has none)."""
    env = {
        "ORTSERVE_LOG_FORMAT": "text",
        "ORTSERVE_API_KEYS": "k",
        "ORTSERVE_WAIT_FOR_MODEL": "true",
    }
    daemon = Daemon(tmp_path / "nowhere", env)
    try:
        daemon.wait_for("STATUS=model failed to load")
        with httpx.Client(base_url=daemon.url, timeout=600) as http:  # bounds a hang only
            assert http.get(FORGING_PATH).status_code == 401
            escapes = "%1b%5b2J%7f%c2%85%e2%80%a8"  # ESC [2J, DEL, NEL, U+2028
            assert http.get(f"/y{escapes}%0d%0a{FORGED.replace(' ', '%20')}").status_code == 401
        deadline = time.monotonic() + 600  # bounds a hang: the lines come at once
        while len(_lines_with(daemon.stderr(), "FORGED")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        stderr = daemon.stderr()
    finally:
        daemon.close()
    first, second = _lines_with(stderr, "FORGED")
    assert f"ortserve.access: GET /x\\u000a{FORGED} 401 " in first, stderr
    escaped = "\\u001b[2J\\u007f\\u0085\\u2028\\u000d\\u000a"
    assert f"ortserve.access: GET /y{escaped}{FORGED} 401 " in second, stderr
    assert not any(line.startswith(STAMP) for line in stderr.split("\n"))
    assert not RAW.search(first + second)
