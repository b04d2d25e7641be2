"""The job counter of a recycled process: the thread that reaches the limit stops taking jobs, and so
does every thread that starts one past it, however late the drain lands (here it never does)."""

from __future__ import annotations

import multiprocessing
import time

import dramatiq
from dramatiq.brokers.stub import StubBroker

from conveyor.tasks.recycling import JOBS, JobCounter, RecycleState
from tests.support.waiting import wait_for


def test_a_process_starts_at_most_threads_minus_one_jobs_past_its_limit():
    limit, threads, sent = 5, 3, 40
    broker = StubBroker()
    state = RecycleState(multiprocessing.get_context("spawn"), limit)
    asked: list[int] = []
    broker.add_middleware(JobCounter(state, on_limit=lambda: asked.append(state.jobs.value)))
    ran: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="q")
    def work(i: int) -> None:
        ran.append(i)
        time.sleep(0.01)

    for i in range(sent):
        work.send(i)
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    worker.start()
    try:
        wait_for(lambda: not any(t.is_alive() for t in worker.workers), message="every thread to stop itself")
    finally:
        worker.stop(timeout=5000)
        broker.close()
    assert limit <= len(ran) <= limit + threads - 1, ran
    assert len(asked) == 1 and state.reason.value == JOBS
    assert state.jobs.value == len(ran)


def test_memory_limits_parse_units_and_refuse_nonsense_without_echoing_it():
    import argparse

    import pytest

    from conveyor.cli.core import _count, _size
    from conveyor.settings import Settings

    assert _size("512MiB") == 512 * 1024**2 and _size("1GiB") == 1024**3 and _size("0") == 0 and _size("") == 0
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        _size("lots")
    assert "lots" not in str(raised.value)
    with pytest.raises(argparse.ArgumentTypeError):
        _count("-3")
    assert Settings(worker_max_memory_per_process="").worker_max_memory_per_process == 0
    assert Settings(worker_max_memory_per_process="2GiB").worker_max_memory_per_process == 2 * 1024**3
