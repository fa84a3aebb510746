"""`core.logs.JsonLog`: the one JSON-line log of every target."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest

from core.logs import JsonLog
from core.records import RequestRecord


def test_a_line_has_level_message_fields_and_context() -> None:
    out = io.StringIO()
    log = JsonLog(out, context=lambda: {"aws_request_id": "req-1"})
    log.write("ERROR", "cold start failed", reason="é", path=Path("/tmp/m"))
    assert json.loads(out.getvalue()) == {"level": "ERROR", "message": "cold start failed",
                                          "reason": "é", "path": "/tmp/m",
                                          "aws_request_id": "req-1"}  # fmt: skip


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
