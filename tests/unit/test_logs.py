"""`core.logs.JsonLog`: the one JSON-line log of every target; at a terminal, the edge
daemon's access lines in words (#27 item 10)."""

from __future__ import annotations

import io
import json
import logging
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from ortserve.core.logs import JsonLog, access_line
from ortserve.core.records import RequestRecord
from ortserve.edge.logs import RequestLog, records_as_text


def test_a_line_has_level_message_fields_and_context() -> None:
    out = io.StringIO()
    log = JsonLog(out, context=lambda: {"aws_request_id": "req-1"})
    log.write("ERROR", "cold start failed", reason="é", path=Path("/tmp/m"))
    assert json.loads(out.getvalue()) == {
        "level": "ERROR",
        "message": "cold start failed",
        "reason": "é",
        "path": "/tmp/m",
        "aws_request_id": "req-1",
    }


def test_cloud_logging_reads_severity() -> None:
    out = io.StringIO()
    JsonLog(out, level_key="severity").record(RequestRecord("r", "GET", "/healthz", 200))
    line = json.loads(out.getvalue())
    assert line["severity"] == "INFO" and "level" not in line
    assert (line["message"], line["event"], line["request_id"]) == ("request", "request", "r")


def test_without_a_stream_lines_go_to_the_current_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = JsonLog()
    log.write("INFO", "hello")
    assert json.loads(capsys.readouterr().out) == {"level": "INFO", "message": "hello"}


def test_lines_from_threads_stay_whole() -> None:
    out = io.StringIO()
    log = JsonLog(out)

    def write(n: int) -> None:
        for i in range(200):
            log.write("INFO", "x" * 500, n=n, i=i)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1600 and all(json.loads(line)["message"] for line in lines)


GENERATION = RequestRecord(
    "r1",
    "POST",
    "/v1/chat/completions",
    200,
    prompt_tokens=12,
    completion_tokens=64,
    ttft_s=0.031,
    tokens_per_s=48.25,
    duration_s=1.354,
    ending="stop",
)
REFUSED = RequestRecord(
    "r2",
    "POST",
    "/generate",
    400,
    duration_s=0.0003,
    reason="invalid_request: max_new_tokens: Input should be greater than or equal to 1",
)


def test_an_access_line_says_what_a_person_wants_to_know() -> None:
    assert access_line(GENERATION) == (
        "POST /v1/chat/completions 200 1.35 s: prompt 12 + 64 new tokens, 48.2 tok/s, "
        "TTFT 31 ms, stop"
    )
    assert access_line(REFUSED) == (
        "POST /generate 400 0 ms: invalid_request: max_new_tokens: Input should be greater "
        "than or equal to 1"
    )
    assert access_line(RequestRecord("r3", "GET", "/readyz", 200, duration_s=0.0004)) == (
        "GET /readyz 200 0 ms"
    )
    drafted = replace(GENERATION, draft_tokens=40, accepted_tokens=31)
    assert access_line(drafted) == (
        "POST /v1/chat/completions 200 1.35 s: prompt 12 + 64 new tokens, 48.2 tok/s, "
        "TTFT 31 ms, 31 of 40 drafts accepted, stop"
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_at_a_terminal_and_json_elsewhere() -> None:
    assert records_as_text("auto", _Terminal()) is True
    assert records_as_text("auto", io.StringIO()) is False
    assert records_as_text("json", _Terminal()) is False
    assert records_as_text("text", io.StringIO()) is True


def test_as_text_a_record_is_an_access_line_on_the_log_and_nothing_on_stdout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stdout = io.StringIO()
    with caplog.at_level(logging.INFO, logger="ortserve.access"):
        failed = RequestRecord(
            "r4", "POST", "/generate", 500, reason="internal_error: internal error"
        )
        RequestLog(True, stdout).record(REFUSED)
        RequestLog(True, stdout).record(failed)
    assert stdout.getvalue() == ""
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", access_line(REFUSED)),
        ("WARNING", "POST /generate 500 0 ms: internal_error: internal error"),
    ]


def test_as_json_a_refusal_carries_its_reason() -> None:
    stdout = io.StringIO()
    RequestLog(False, stdout).record(REFUSED)
    line = json.loads(stdout.getvalue())
    assert (line["status"], line["reason"]) == (400, REFUSED.reason)
