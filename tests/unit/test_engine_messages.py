"""What the daemon accepts from its engine process (#51 item 2): messages of allowed types
and shapes only. A child compromised through native code could send any bytes; pickle's
REDUCE of a callable it names is refused before the callable is looked up, and a reply of
the wrong shape is a fault of the child, never an exception in the daemon."""

from __future__ import annotations

import os
import pickle
import socket
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortserve.core.engine_process import (
    MalformedMessageError,
    loaded_of,
    receive_from_child,
    reply_of,
)
from ortserve.core.errors import ProviderUnavailableError
from ortserve.core.generation import Drafts, TokenLogprob


def _through(payload: bytes) -> Any:
    ours, theirs = socket.socketpair()
    with Connection(ours.detach()) as parent, Connection(theirs.detach()) as child:
        child.send_bytes(payload)
        return receive_from_child(parent)


class _Touch:
    """What an attacker would pickle: a REDUCE that runs a command when loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_a_message_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for payload in (
        pickle.dumps((7, True, _Touch(marker))),
        pickle.dumps(_Touch(marker)),
        pickle.dumps((7, True, [1, {"x": _Touch(marker)}])),
    ):
        with pytest.raises(MalformedMessageError, match=r"posix\.system"):
            _through(payload)
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(_Touch(marker))) == 0 and marker.exists()  # it would


def test_what_a_child_sends_decodes() -> None:
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    replies = [
        (1, True, None),
        (2, True, (5, TokenLogprob(5, -0.5, ((5, -0.5), (9, -1.0))), Drafts(3, 2))),
        (3, True, [4, 9, -1]),
        (4, True, logits),
        (5, True, ["adapter-a"]),
        (6, False, ("RuntimeError", "og says no")),
    ]
    for reply in replies:
        got = reply_of(_through(pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)))
        if isinstance(reply[2], np.ndarray):
            assert np.array_equal(got[2], logits) and got[2].dtype == np.float32
        else:
            assert got == reply
    ready = ("ready", "cpu", {"cuda": "not installed"})
    assert loaded_of(_through(pickle.dumps(ready))) == ready
    failed = loaded_of(_through(pickle.dumps(("failed", ProviderUnavailableError("x", {})))))
    assert isinstance(failed[1], ProviderUnavailableError)


@pytest.mark.parametrize(
    "message",
    [
        None,
        (1, True),
        ("1", True, None),
        (1, 1, None),
        (1, False, "boom"),
        (1, False, ("RuntimeError", 7)),
        [1, True, None],
    ],
)
def test_a_reply_of_the_wrong_shape_is_malformed(message: Any) -> None:
    with pytest.raises(MalformedMessageError):
        reply_of(message)


@pytest.mark.parametrize(
    "message", [("ready", "cpu"), ("failed", "text"), ("ready", 1, {}), ("other",), 5]
)
def test_a_handshake_of_the_wrong_shape_is_malformed(message: Any) -> None:
    with pytest.raises(MalformedMessageError):
        loaded_of(message)


def test_bytes_that_do_not_decode_are_malformed() -> None:
    with pytest.raises(MalformedMessageError, match="does not decode"):
        _through(b"\x80\x05garbage")
