"""Worker recycling for real: `conveyor worker --max-jobs-per-process / --max-memory-per-process`.

A recycled process drains (its running jobs finish, its prefetched ones go
back unstarted) while its replacement already works; every job runs once.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings, probe_runs
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url)


def finished(database_url, prefix):
    return [r for r in probe_runs(database_url, prefix) if r["finished_at"] is not None]


def test_max_jobs_recycles_processes_and_every_job_runs_once(app, workers, database_url):
    threads, limit, total = 2, 5, 40
    worker = workers("nudge", CONVEYOR_WORKER_MAX_JOBS_PER_PROCESS=str(limit), CONVEYOR_WORKER_THREADS=str(threads))
    for i in range(total):
        app.jobs.enqueue("test.probe.nudge", {"token": f"rj{i:03d}", "sleep": 0.05})
    wait_for(lambda: len(finished(database_url, "rj")) >= total, timeout=90, message="every job to finish")
    runs = probe_runs(database_url, "rj")
    # Once each: nothing lost, nothing started twice (a prefetched job went back unstarted).
    assert sorted(r["token"] for r in runs) == [f"rj{i:03d}" for i in range(total)]
    assert all(r["finished_at"] is not None for r in runs)
    per_process = Counter(r["pid"] for r in runs)
    # The process that starts job N stops there; each other thread may hold one more.
    assert max(per_process.values()) <= limit + threads - 1, per_process
    assert len(per_process) >= total // (limit + threads - 1)
    recycled = wait_for(lambda: worker.events("worker_recycled"), message="a worker_recycled line")
    assert len(recycled) >= 3 and {e["reason"] for e in recycled} == {"jobs"}
    assert all(e["jobs"] >= limit for e in recycled)
    assert not worker.events("worker_died"), "a recycle is no crash"
    done = worker.events("worker_recycle_done")
    assert done and all(e["recycling_s"] >= 0 for e in done)
    print(f"recycling time (trigger to the new process's first job): {[e['recycling_s'] for e in done]}")
    assert worker.terminate() == 0


def test_recycle_waits_for_a_long_job_while_the_replacement_works(app, workers, database_url):
    worker = workers("nudge", CONVEYOR_WORKER_MAX_JOBS_PER_PROCESS="2", CONVEYOR_WORKER_THREADS="2")
    app.jobs.enqueue("test.probe.nudge", {"token": "long", "sleep": 6})
    first = wait_for(lambda: probe_runs(database_url, "long"), message="the long job to start")[0]
    app.jobs.enqueue("test.probe.nudge", {"token": "second"})  # job 2 of 2: the recycle starts
    wait_for(lambda: worker.events("worker_recycled"), message="the recycle")
    app.jobs.enqueue("test.probe.nudge", {"token": "third"})
    third = wait_for(lambda: finished(database_url, "third"), timeout=30, message="the replacement's job")[0]
    long = wait_for(lambda: finished(database_url, "long"), timeout=30, message="the long job to finish")[0]
    assert third["pid"] != long["pid"] == first["pid"]
    assert [r["token"] for r in probe_runs(database_url, "long")] == ["long"]  # ran once, not cut off
    # Overlap: the replacement was up before the drained process stopped.
    drained = wait_for(
        lambda: [e for e in worker.events("worker_stopped") if e["pid"] == long["pid"]], message="the drain's end"
    )[0]
    started = {e["pid"]: e["ts"] for e in worker.events("worker_started")}
    assert started[third["pid"]] < drained["ts"]
    assert worker.terminate() == 0


def test_max_memory_recycles_a_process_that_grew(app, workers, database_url):
    worker = workers("nudge", CONVEYOR_WORKER_MAX_MEMORY_PER_PROCESS="300MiB", CONVEYOR_WORKER_THREADS="2")
    app.jobs.enqueue("test.hog", {"token": "hog", "mib": 320})
    recycled = wait_for(lambda: worker.events("worker_recycled"), timeout=30, message="the memory recycle")
    assert recycled[0]["reason"] == "memory" and recycled[0]["rss"] > 300 * 1024 * 1024
    hog = wait_for(lambda: finished(database_url, "hog"), message="the hog job to finish")
    assert len(hog) == 1 and hog[0]["pid"] == recycled[0]["pid"]
    # Once the drained process is gone (a job enqueued sooner may still reach it before its stop does).
    wait_for(lambda: any(e["pid"] == hog[0]["pid"] for e in worker.events("worker_stopped")), message="the drain's end")
    app.jobs.enqueue("test.probe.nudge", {"token": "after"})
    after = wait_for(lambda: finished(database_url, "after"), message="a job on the fresh process")[0]
    assert after["pid"] != hog[0]["pid"]
    wait_for(lambda: worker.events("worker_recycle_done"), message="the recycle's end")
    assert len(worker.events("worker_recycled")) == 1, "the fresh process stays under the limit"
    assert not worker.events("worker_died")
    assert worker.terminate() == 0
