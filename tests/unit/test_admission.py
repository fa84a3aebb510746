"""Admission control: N at once, a bounded queue, Busy with a hint instead of a hang."""

from __future__ import annotations

import threading
import time

import pytest

from ortserve.core.admission import Admission
from ortserve.core.errors import BusyError, ClientClosedError


def test_queue_full_is_refused_at_once() -> None:
    gate = Admission(max_active=1, max_queue=0, timeout_s=60)
    gate.acquire()
    with pytest.raises(BusyError, match="queue full") as info:
        gate.acquire()
    assert info.value.retry_after_s >= 1
    assert info.value.status == 503


def test_wait_times_out_with_busy() -> None:
    gate = Admission(max_active=1, max_queue=4, timeout_s=0.05)
    gate.acquire()
    with pytest.raises(BusyError, match=r"no slot within 0\.05 s"):
        gate.acquire()
    assert gate.waiting == 0
    assert gate.active == 1


def test_a_waiter_gets_the_slot_when_it_is_released() -> None:
    gate = Admission(max_active=1, max_queue=4, timeout_s=10)
    gate.acquire()
    got = threading.Event()

    def waiter() -> None:
        gate.acquire()
        got.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    while gate.waiting == 0:
        threading.Event().wait(0.001)
    assert not got.is_set()
    gate.release(0.5)
    thread.join(5)
    assert got.is_set()
    assert gate.active == 1
    assert gate.waiting == 0


def _waiting_thread(gate: Admission, batched: bool, got: threading.Event) -> threading.Thread:
    before = gate.waiting

    def run() -> None:
        gate.acquire(batched)
        got.set()

    thread = threading.Thread(target=run)
    thread.start()
    while gate.waiting == before and not got.is_set():
        threading.Event().wait(0.001)
    return thread


def test_a_generation_alone_waits_for_a_batch_to_leave_and_none_overtake_it() -> None:
    gate = Admission(max_active=1, max_queue=4, timeout_s=10, batch=4)
    for _ in range(3):
        assert gate.acquire(batched=True) == 0.0  # three sequences of a batch
    alone, small = threading.Event(), threading.Event()
    first = _waiting_thread(gate, False, alone)  # needs the whole generation
    second = _waiting_thread(gate, True, small)  # a batch place is free, but FIFO
    assert gate.waiting == 2 and not alone.is_set() and not small.is_set()
    for _ in range(3):
        gate.release(0.1, batched=True)
    first.join(5)
    assert alone.is_set() and not small.is_set()
    gate.release(0.1)
    second.join(5)
    assert small.is_set() and gate.active == 1 and gate.waiting == 0
    for _ in range(3):
        gate.acquire(batched=True)
    assert gate.active == 4  # a full batch
    gate.timeout_s = 0.02
    with pytest.raises(BusyError, match="no slot within"):
        gate.acquire(batched=True)
    for _ in range(4):
        gate.release(0.1, batched=True)
    assert gate.active == 0 and gate.acquire() == 0.0


def test_a_waiter_whose_client_leaves_leaves_the_queue_at_once() -> None:
    gate = Admission(max_active=1, max_queue=4, timeout_s=60)
    gate.acquire()
    cancelled = threading.Event()
    errors: list[ClientClosedError] = []

    def waiter() -> None:
        try:
            gate.acquire(cancelled=cancelled)
        except ClientClosedError as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    while gate.waiting == 0:
        threading.Event().wait(0.001)
    start = time.monotonic()
    cancelled.set()
    thread.join(5)
    assert time.monotonic() - start < 0.5  # not at the 60 s queue timeout
    assert len(errors) == 1 and errors[0].status == 499
    assert gate.waiting == 0 and gate.active == 1


def test_a_request_whose_client_left_takes_no_free_slot() -> None:
    gate = Admission(max_active=1, max_queue=0, timeout_s=60)
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(ClientClosedError):
        gate.acquire(cancelled=cancelled)
    assert gate.active == 0 and gate.acquire() == 0.0
