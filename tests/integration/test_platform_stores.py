"""Stream buffers and fleet-wide limits: one contract, run against each store (redis, postgres, inline)."""

from __future__ import annotations

import threading

import pytest

from conveyor.app import App
from conveyor.budgets import Take, budget_store
from conveyor.platform.limits import build_limits, limits_for
from conveyor.platform.settings import PlatformSettings
from conveyor.platform.streams import build_buffer
from conveyor.settings import Settings
from tests.support.brokers import ALL_BROKERS


@pytest.fixture(params=[*ALL_BROKERS, "postgres+pgbouncer", "redis-cluster"])
def app(request, redis_url, database_url):
    if request.param == "redis-cluster":  # redis+cluster://: every script call on one slot
        settings = Settings(
            broker="redis", redis_url=request.getfixturevalue("redis_cluster_url"), database_url=database_url
        )
    elif request.param == "postgres+pgbouncer":  # through a transaction-mode pooler, LISTEN and slots direct
        through = request.getfixturevalue("pgbouncer").url(database_url.rsplit("/", 1)[1])
        settings = Settings(
            broker="postgres", database_url=through, database_pooled=True, listen_database_url=database_url
        )
    else:
        settings = Settings(broker=request.param, redis_url=redis_url, database_url=database_url)
    app = App(settings)
    yield app
    app.close()


def test_appending_a_seq_twice_keeps_the_first_chunk(app):
    buffer = build_buffer(app)
    assert buffer.append("r1", 1, "Hello ") is True
    assert buffer.append("r1", 2, "world") is True
    assert buffer.append("r1", 1, "HELLO ") is False  # a re-run regenerating chunk 1
    assert buffer.append("r1", 2, "world") is False

    assert [(e.seq, e.kind, e.data) for e in buffer.read("r1")] == [(1, "chunk", "Hello "), (2, "chunk", "world")]
    assert buffer.read("other") == []


def test_reading_after_a_seq_returns_only_what_follows(app):
    buffer = build_buffer(app)
    for seq in range(1, 8):
        buffer.append("r1", seq, f"c{seq}")

    assert [e.seq for e in buffer.read("r1", after=5)] == [6, 7]
    assert [e.seq for e in buffer.read("r1", after=2, limit=2)] == [3, 4]
    assert buffer.read("r1", after=7) == []


def test_a_stream_ends_once_and_takes_no_chunk_after(app):
    buffer = build_buffer(app)
    buffer.append("r1", 1, "only")
    buffer.end("r1", "completed")
    buffer.end("r1", "failed")
    assert buffer.append("r1", 2, "late") is False

    entries = buffer.read_all("r1")
    assert [(e.seq, e.kind, e.data) for e in entries] == [(1, "chunk", "only"), (2, "end", "completed")]


def test_an_empty_stream_can_end(app):
    buffer = build_buffer(app)
    buffer.end("r1", "failed")
    assert [(e.seq, e.kind, e.data) for e in buffer.read("r1")] == [(1, "end", "failed")]


def test_semaphore_gives_at_most_limit_slots_and_frees_them_on_release(app):
    semaphore = limits_for(app).semaphore
    first = semaphore.try_acquire("queue:llm", 2)
    second = semaphore.try_acquire("queue:llm", 2)

    assert first is not None and second is not None
    assert semaphore.try_acquire("queue:llm", 2) is None
    assert semaphore.try_acquire("queue:other", 1) is not None  # names are separate

    first.release()
    first.release()  # twice is harmless and frees nothing more
    third = semaphore.try_acquire("queue:llm", 2)
    assert third is not None
    assert semaphore.try_acquire("queue:llm", 2) is None
    second.release()
    third.release()


def test_semaphore_holds_under_contention_from_many_threads(app):
    semaphore = limits_for(app).semaphore
    held, peak, lock = [0], [0], threading.Lock()
    barrier = threading.Barrier(8)

    def contend():
        barrier.wait()
        for _ in range(20):
            with semaphore.held("queue:llm", 3) as slot:
                if slot is None:
                    continue
                with lock:
                    held[0] += 1
                    peak[0] = max(peak[0], held[0])
                with lock:
                    held[0] -= 1

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert 1 <= peak[0] <= 3


def test_the_provider_budget_refuses_requests_past_the_limit_with_the_wait(app):
    store = budget_store(app)  # the llm queue's provider rate limit is a library budget on the broker's store
    one = Take("provider-requests", 3, 600, 1)
    assert [store.take([one]) for _ in range(3)] == [[0.0], [0.0], [0.0]]

    (wait,) = store.take([one])
    assert 0 < wait <= 600
    assert store.take([Take("another", 3, 600, 1)]) == [0.0]


def test_a_postgres_slot_is_freed_when_its_holder_process_dies(database_url):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.waiting import wait_for

    app = App(Settings(broker="postgres", database_url=database_url))
    semaphore = limits_for(app).semaphore
    code = (
        "import sys, time; from conveyor.app import App; from conveyor.settings import Settings; "
        "from conveyor.platform.limits import build_limits; "
        "app = App(Settings(broker='postgres', database_url=sys.argv[1])); "
        "slot = build_limits(app).semaphore.try_acquire('queue:llm', 1); "
        "print('held' if slot else 'none', flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", code, database_url], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert semaphore.try_acquire("queue:llm", 1) is None
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        slot = wait_for(lambda: semaphore.try_acquire("queue:llm", 1), timeout=15, message="the dead holder's slot")
        slot.release()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.stdout.close()
        holder.wait()
    app.close()


def test_a_redis_slot_whose_holder_stopped_renewing_expires_after_its_lease(redis_url, database_url):
    from tests.support.waiting import wait_for

    app = App(
        Settings(broker="redis", redis_url=redis_url, database_url=database_url),
        blueprint_settings=[PlatformSettings(llm_slot_lease=0.5)],
    )
    semaphore = limits_for(app).semaphore
    kept = semaphore.try_acquire("queue:kept", 1)
    # A holder that died: its slot is in the set, and nobody renews it.
    assert semaphore._call("acquire", "conveyor:slots:queue:llm", "dead-worker", 1) == 1
    assert semaphore.try_acquire("queue:llm", 1) is None

    slot = wait_for(lambda: semaphore.try_acquire("queue:llm", 1), timeout=10, message="the lease to expire")
    assert semaphore.try_acquire("queue:kept", 1) is None  # a live holder's renewals keep its slot past the lease
    slot.release()
    kept.release()
    app.close()


def test_a_redis_stream_reads_back_when_redis_url_asks_for_decoded_replies(redis_url):
    """REDIS_URL's own options (``?decode_responses=true``) win over the client's: replies come as text."""
    separator = "&" if "?" in redis_url else "?"
    app = App(Settings(broker="redis", redis_url=f"{redis_url}{separator}decode_responses=true"))
    buffer = build_buffer(app)
    try:
        buffer.client.set("probe", "x")
        assert buffer.client.get("probe") == "x"  # the URL's option reached the client: replies are text
        buffer.append("r1", 1, "Hello ")
        buffer.end("r1", "completed")
        assert [(e.seq, e.kind, e.data) for e in buffer.read("r1")] == [(1, "chunk", "Hello "), (2, "end", "completed")]
    finally:
        buffer.close()
        app.close()


@pytest.mark.parametrize("build", [build_buffer, build_limits], ids=["streams", "limits"])
def test_the_redis_stores_without_a_redis_url_are_a_configuration_error(build):
    from conveyor.errors import ConfigurationError

    app = App(Settings(broker="redis", redis_url=None))
    with pytest.raises(ConfigurationError, match="REDIS_URL"):
        build(app)
    app.close()


@pytest.mark.parametrize("app", ["postgres+pgbouncer"], indirect=True)
def test_the_limits_direct_sessions_through_a_pooler_are_closed_with_the_app(app):
    """Through a transaction-mode pooler the advisory-lock slots get a pool of direct sessions of their
    own; it closes with the App (left to the garbage collector, its threads outlived the App)."""
    pool = limits_for(app)._owned
    assert pool is not None and not pool.closed
    app.close()
    assert pool.closed
