"""The campaign's checker (tests/faults/history.py) on synthetic histories: each rule fires, a clean one passes."""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

from tests.faults import nemesis
from tests.faults.history import ACKED, REFUSED, UNKNOWN, Effect, History, Hook, LeaseFault, Request, Run, check

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def run(job: str, token: str, delivery: int, start: float, end: float | None, ok=True, fenced=False, rid=None):
    return Run(
        rid or f"r-{job}-{delivery}-{start}",
        job,
        token,
        delivery,
        100 + delivery,
        at(start),
        None if end is None else at(end),
        ok,
        fenced,
    )


def clean() -> History:
    """Two jobs that completed once each, one that failed with its hook, one charge; nothing left."""
    charge = ("consume:t:m", "u", Decimal("0.004"))
    reqs = [
        Request("a", "fault.work.nudge", outcome=ACKED, job_ids=["A"]),
        Request("b", "fault.work.nudge", key="job:b", outcome=ACKED, job_ids=["B"]),
        Request("c", "fault.work.nudge", expect="failed", outcome=ACKED, job_ids=["C"]),
        Request(
            "credit:t:m", "credit.consume", key="credit:t:m", logged=False, charge=charge, outcome=ACKED, job_ids=["D"]
        ),
    ]
    runs = [run("A", "a", 1, 0, 1), run("B", "b", 1, 0, 1), run("C", "c", 1, 0, 0.5, ok=False)]
    effects = [Effect(runs[0].run_id, "A", "a", 1, False), Effect(runs[1].run_id, "B", "b", 1, False)]
    return History(
        requests=reqs,
        runs=runs,
        effects=effects,
        hooks=[Hook("C", "c", True)],
        states={"A": "completed", "B": "completed", "C": "failed", "D": "completed"},
        leftovers={"nudge": (0, 0, 0)},
        entries=[("consume:t:m", "u", Decimal("-0.004"))],
        balances={"u": Decimal("-0.004")},
    )


def test_a_clean_history_has_no_anomaly():
    assert check(clean()) == {}


def test_an_acknowledged_job_that_never_ended_is_stuck_and_one_gone_is_lost():
    h = clean()
    h.states["A"] = "active"
    h.states["B"] = "missing"
    found = check(h)
    assert any("A" in x and "active" in x for x in found["stuck"])
    assert any("(B) ended missing" in x for x in found["lost"])


def test_a_completed_job_without_its_effect_is_lost():
    h = clean()
    h.effects = h.effects[1:]
    assert any("effect is missing" in x for x in check(h)["lost"])


def test_a_refused_enqueue_that_ran_anyway_is_flagged():
    h = clean()
    h.requests.append(Request("e", "fault.work.nudge", outcome=REFUSED))
    h.runs.append(run("E", "e", 1, 2, 3))
    assert list(check(h)) == ["refused-ran"]


def test_a_request_that_became_two_jobs_is_doubled():
    h = clean()
    # An unkeyed request retried after a "nothing was enqueued" that was in fact applied (a lost reply).
    h.requests[0].job_ids = ["A", "A2"]
    h.states["A2"] = "completed"
    assert any("became 2 jobs" in x for x in check(h)["doubled"])


def test_an_unknown_outcome_may_run_once_but_not_twice():
    h = clean()
    h.requests.append(Request("u", "fault.work.nudge", outcome=UNKNOWN))
    h.runs.append(run("U1", "u", 1, 2, 3))
    assert check(h) == {}
    h.runs.append(run("U2", "u", 1, 4, 5))
    assert any("u: one request became 2 jobs" in x for x in check(h)["doubled"])


def test_a_repeated_key_past_its_dedup_window_may_make_a_second_job():
    h = clean()
    req = h.requests[1]
    req.job_ids = ["B", "B2"]
    h.states["B2"] = "completed"
    req.first_sent, req.last_sent = 100.0, 100.0 + h.dedup_ttl
    assert check(h) == {}
    req.first_sent, req.last_sent = 100.0, 101.0
    assert "doubled" in check(h)
    req.clock_stepped = True  # the server's clock jumped past the key's window meanwhile
    assert check(h) == {}


def test_overlapping_bodies_with_unfenced_effects_are_flagged():
    h = clean()
    # A paused delivery 1 resumes after delivery 2 started and writes its effect too.
    h.runs.append(run("A", "a", 2, 0.5, 1.5))
    h.effects.append(Effect(h.runs[-1].run_id, "A", "a", 2, False))
    assert list(check(h)) == ["overlapping"]


def paused(pid: int, began: float, ended: float) -> LeaseFault:
    """A pause of ``pid`` from ``began`` to ``ended`` (seconds after T0), over its window as the campaign
    widens it (1 s before; a lease of 3 s, a recovery pass of 0.5 s and 3 s after)."""
    return LeaseFault("pause", at(began - 1.0).timestamp(), at(ended + 6.5).timestamp(), pid=pid)


def test_overlap_is_allowed_when_the_stale_delivery_fenced_and_rolled_back():
    h = clean()
    h.runs[0] = dataclasses.replace(h.runs[0], fenced=True)
    h.effects[0] = Effect("r-new", "A", "a", 2, True)  # only the current delivery's effect committed
    h.runs.append(run("A", "a", 2, 0.5, 1.5, fenced=True, rid="r-new"))
    h.lease_faults = [paused(h.runs[0].pid, 0.1, 0.9)]
    assert check(h) == {}


def fenced_overlap() -> History:
    """Delivery 1 of A (pid 101) runs 0-1 s, delivery 2 (pid 102) starts at 0.5 s; both fenced, only the
    second's effect committed: harmless, and allowed when a fault took delivery 1's lease then."""
    h = clean()
    h.runs[0] = dataclasses.replace(h.runs[0], fenced=True)
    h.effects[0] = Effect("r-new", "A", "a", 2, True)
    h.runs.append(run("A", "a", 2, 0.5, 1.5, fenced=True, rid="r-new"))
    return h


def test_overlap_is_excused_by_a_pause_of_the_stale_deliverys_process():
    h = fenced_overlap()
    assert any("no fault took its lease" in x for x in check(h)["overlapping"])
    h.lease_faults = [paused(101, 0.1, 0.4)]
    assert check(h) == {}
    h.lease_faults = [paused(102, 0.1, 0.4)]  # the current delivery's process: not the stale one's lease
    assert list(check(h)) == ["overlapping"]
    # A cut-off host or a skewed group: runs of that host only.
    h.runs[0] = dataclasses.replace(h.runs[0], host="far1")
    cut = (at(-0.9).timestamp(), at(6.9).timestamp())
    h.lease_faults = [LeaseFault("partition", *cut, host="far1")]
    assert check(h) == {}
    h.lease_faults = [LeaseFault("partition", *cut, host="near0")]
    assert list(check(h)) == ["overlapping"]
    h.lease_faults = [LeaseFault("postgres-crash", *cut)]  # a server away: every worker's lease
    assert check(h) == {}


def test_overlap_is_not_excused_by_a_step_of_the_servers_clock():
    """Finding 7: a step of the Postgres server's clock must not make recovery declare live workers dead."""
    import types

    from tests.faults import campaign
    from tests.faults.nemesis import Fault

    h = fenced_overlap()
    step = Fault(0.1, "postgres-clock", "postgres", 2.0, 20.0)
    stage = types.SimpleNamespace(
        applied=[campaign.Applied(step, at(0.1).timestamp(), at(2.1).timestamp())],
        paused=[],
        far_hosts={"far1"},
        skewed=[],
    )
    h.lease_faults = campaign.lease_faults(stage)
    h.fault_windows = [(at(-0.9).timestamp(), at(8.6).timestamp())]  # it may lose acks: not leases
    assert h.lease_faults == []
    assert list(check(h)) == ["overlapping"]
    pause = Fault(0.1, "pause", "slow-body", 4.0)
    stage.applied.append(campaign.Applied(pause, at(0.1).timestamp(), at(4.1).timestamp(), "pid 101"))
    stage.paused.append((101, at(0.1).timestamp(), at(4.1).timestamp()))
    h.lease_faults = campaign.lease_faults(stage)
    assert [(f.kind, f.pid) for f in h.lease_faults] == [("pause", 101)]
    assert check(h) == {}


def test_overlap_is_not_excused_by_a_pause_outside_its_window():
    h = fenced_overlap()
    h.runs[0] = dataclasses.replace(h.runs[0], ended=at(30))
    h.runs[-1] = dataclasses.replace(h.runs[-1], started=at(20), ended=at(21))
    h.lease_faults = [paused(101, 0.1, 4.0)]  # healed at 4 s: its window ends at 10.5 s, the rerun came at 20 s
    assert list(check(h)) == ["overlapping"]
    h.lease_faults = [paused(101, 12.0, 16.0)]
    assert check(h) == {}
    h.lease_faults = [paused(101, 22.0, 26.0)]  # began after the rerun had started (and 1 s more)
    assert list(check(h)) == ["overlapping"]


def test_a_run_whose_end_was_never_learnt_overlaps_everything_after_it():
    h = clean()
    h.runs[0] = dataclasses.replace(h.runs[0], ended=None, ok=None)
    h.runs.append(run("A", "a", 2, 30, 31))
    assert list(check(h)) == ["overlapping"]


def test_a_fenced_effect_applied_twice_is_doubled():
    h = clean()
    h.effects = [Effect("r1", "A", "a", 1, True), Effect("r2", "A", "a", 2, True), h.effects[1]]
    assert any("fenced effect applied 2 times" in x for x in check(h)["doubled"])


def test_hooks_must_complete_exactly_once_per_failed_job():
    h = clean()
    h.hooks = [Hook("C", "c", False)]  # killed midway, never run again
    assert any("0 completed hook(s) of 1 started" in x for x in check(h)["hook"])
    h.hooks = [Hook("C", "c", False), Hook("C", "c", True)]  # killed, re-run to its end: fine
    assert check(h) == {}
    h.hooks = [Hook("C", "c", True), Hook("C", "c", True)]
    assert "doubled" in check(h)
    h.hooks = [Hook("C", "c", True), Hook("A", "a", True)]  # a hook for a job that completed
    assert any("completed, yet its final-failure hook ran" in x for x in check(h)["doubled"])


def test_an_undecodable_message_must_end_failed_not_active():
    h = clean()
    h.requests.append(Request("p", "fault.work.nudge", outcome=ACKED, job_ids=["P"], poison=True))
    h.states["P"] = "active"
    assert any("P" in x for x in check(h)["stuck"])
    h.states["P"] = "failed"
    assert check(h) == {}


def test_work_left_in_a_queue_is_stuck():
    h = clean()
    h.leftovers["nudge"] = (0, 1, 0)
    assert any("1 delayed" in x for x in check(h)["stuck"])


def test_the_ledger_must_be_exact():
    h = clean()
    h.entries.append(("consume:t:m", "u", Decimal("-0.004")))
    assert any("charged 2 times" in x for x in check(h)["ledger"])
    h = clean()
    h.balances["u"] = Decimal("-0.008")
    assert any("balance" in x for x in check(h)["ledger"])
    h = clean()
    h.entries, h.balances = [], {}
    assert any("charge is missing" in x for x in check(h)["lost"])
    h = clean()
    h.verify = "rc=1 1 entries, 1 mismatches"
    assert "ledger" in check(h)


def test_a_refused_charge_must_not_be_in_the_ledger():
    h = clean()
    h.requests[3].outcome = REFUSED
    assert "refused-ran" in check(h)


def test_a_seed_replays_the_same_schedule_and_pending_kinds_stay_out():
    kinds = nemesis.kinds_for("redis")
    one = nemesis.schedule(7, "redis", window=14, faults=6, kinds=kinds)
    assert one == nemesis.schedule(7, "redis", window=14, faults=6, kinds=kinds)
    assert one != nemesis.schedule(8, "redis", window=14, faults=6, kinds=kinds)
    assert not {kind for kind, broker in nemesis.FAULTS_PENDING_FIX if broker == "redis"} & set(kinds)
    assert {"pause", "kill-hook"} <= set(nemesis.kinds_for("redis", everything=True))


def test_a_message_still_reserved_at_the_end_is_stuck():
    h = clean()
    h.reserved = {"conveyor:__acks__.w1.nudge": 0, "conveyor:nudge.msgs": 1}
    assert check(h) == {"stuck": ["conveyor:nudge.msgs: 1 message(s) still reserved or stored at the end"]}


def test_the_ci_seeds_draw_every_fault_kind_ci_runs_on_each_broker():
    """If this fails after a kind left FAULTS_PENDING_FIX, pick CI seeds that cover every kind again."""
    from tests.faults.campaign import CI, CLUSTER
    from tests.faults.test_campaign import CI_SEEDS, CLUSTER_SEEDS

    for broker in ("redis", "postgres"):
        kinds = nemesis.kinds_for(broker)
        drawn = {
            fault.kind
            for seed in CI_SEEDS
            for fault in nemesis.schedule(seed, broker, window=CI.window, faults=CI.faults, kinds=kinds)
        }
        assert drawn == set(kinds), (broker, set(kinds) - drawn)
    # The cluster's one seed: its own kind at least (the others run on the two brokers above).
    kinds = nemesis.kinds_for(CLUSTER)
    drawn = {
        fault.kind
        for seed in CLUSTER_SEEDS
        for fault in nemesis.schedule(seed, CLUSTER, window=CI.window, faults=CI.faults, kinds=kinds)
    }
    assert "failover" in drawn or "failover" in nemesis.KINDS_OUT_OF_CI


def test_overlap_is_allowed_when_both_fenced_and_the_effect_applied_once():
    h = clean()
    # The stale delivery wrote its effect (once) before it was paused; the rerun's once-guard wrote none.
    h.runs[0] = dataclasses.replace(h.runs[0], fenced=True)
    h.effects[0] = Effect(h.runs[0].run_id, "A", "a", 1, True)
    h.runs.append(run("A", "a", 2, 0.5, 1.5, fenced=True))
    h.lease_faults = [paused(h.runs[0].pid, 0.1, 0.9)]
    assert check(h) == {}
    h.runs[-1] = dataclasses.replace(h.runs[-1], fenced=False)  # an unfenced rerun: no such promise
    assert list(check(h)) == ["overlapping"]


def test_the_soak_summary_names_each_failing_seed_with_its_replay():
    import dataclasses as dc

    from tests.faults.report import CampaignRun
    from tests.faults.soak import summarize

    clean_run = CampaignRun(1, "redis", 100, 2, 1, 130, 90, 4, {"kill": 3}, ["t=1 kill(any)"], {}, [], 30.0)
    failing = dc.replace(clean_run, seed=77, broker="postgres", anomalies={"doubled": 1}, examples=["doubled: x"])
    text = summarize([dc.asdict(clean_run), dc.asdict(failing)], rounds=1, seconds=120)
    assert "CAMPAIGN_SEED=77" in text and "on postgres" in text and "doubled 1" in text
    assert "CAMPAIGN_SEED=1 " not in text


def test_a_run_killed_after_its_transactional_completion_counts_as_ended():
    h = clean()
    h.runs[0] = dataclasses.replace(h.runs[0], ok=False, fenced=True)
    assert any("no run reached its end" in x for x in check(h)["lost"])  # its effect was not fenced
    h.effects[0] = Effect(h.runs[0].run_id, "A", "a", 1, True)
    assert check(h) == {}


def test_a_job_re_enqueued_by_a_users_middleware_must_run_as_asked_and_not_loop():
    h = clean()
    h.requests[0] = dataclasses.replace(h.requests[0], polls=2)
    # Asked for two more runs: three runs that reached their end (the last with the effect) is clean.
    h.runs += [run("A", "a", 2, 1.5, 2), run("A", "a", 3, 2.5, 3)]
    assert check(h) == {}
    lost = clean()
    lost.requests[0] = dataclasses.replace(lost.requests[0], polls=2)
    lost.runs.append(run("A", "a", 2, 1.5, 2))  # two runs: the second re-enqueue was lost
    assert any("asked for 2 more run(s), ran to its end 2 time(s)" in x for x in check(lost)["lost"])
    h.runs += [run("A", "a", d, d, d + 0.5, ok=False) for d in range(4, 10)]  # rerun at once, again and again
    assert any("looped" in x for x in check(h)["doubled"])


def test_a_pool_the_time_limits_leaked_is_flagged():
    h = clean()
    h.pool_problems.append("limits-1.0: 3 of 20 pool connections leaked (700 time limits)")
    assert check(h) == {"leaked": ["limits-1.0: 3 of 20 pool connections leaked (700 time limits)"]}


# -- the control features: cancel and the group cap (issues 18, 21) -----------------------------------


def held(job: str, token: str, delivery: int, start: float, end: float, held=True):
    r = run(job, token, delivery, start, end)
    r.held = held
    return r


def grouped_history(*runs: Run, cap: int = 2) -> History:
    h = clean()
    tokens = sorted({r.token for r in runs})
    for token in tokens:
        job_id = next(r.job_id for r in runs if r.token == token)
        h.requests.append(Request(token, "fault.grouped", group="g0", outcome=ACKED, job_ids=[job_id]))
        h.states[job_id] = "completed"
        h.effects.append(Effect(f"e-{token}", job_id, token, 1, False))
    h.runs += list(runs)
    h.group_cap = cap
    return h


def test_more_held_runs_of_a_group_than_its_cap_at_once_is_flagged():
    h = grouped_history(held("G1", "g1", 1, 0, 2), held("G2", "g2", 1, 0.5, 2), held("G3", "g3", 1, 1, 3))
    assert list(check(h)) == ["group-cap"]
    # A run that starts as another ends is not at once with it, nor one that starts within the hundredth of
    # a second the other's logged end may be late by (/proc/uptime's resolution).
    h = grouped_history(held("G1", "g1", 1, 0, 1), held("G2", "g2", 1, 0.5, 2), held("G3", "g3", 1, 0.99, 3))
    assert check(h) == {}
    h = grouped_history(held("G1", "g1", 1, 0, 1), held("G2", "g2", 1, 0.5, 2), held("G3", "g3", 1, 0.97, 3))
    assert list(check(h)) == ["group-cap"]


def test_a_fenced_or_unchecked_run_does_not_count_against_the_group_cap():
    # The first one's delivery was taken back (a pause past the lease): the broker rightly handed its slot on.
    fenced = held("G1", "g1", 1, 0, 3, held=False)
    unknown = held("G4", "g4", 1, 0, 3, held=None)
    h = grouped_history(fenced, unknown, held("G2", "g2", 1, 0.5, 2), held("G3", "g3", 1, 1, 2.5))
    assert check(h) == {}


def cancelled(answer: str, state: str, *, runs=(), answered: float = 1.0, hooks=0) -> History:
    h = clean()
    h.requests.append(
        Request(
            "x",
            "fault.work.nudge",
            outcome=ACKED,
            job_ids=["X"],
            cancel=answer,
            cancel_answered=at(answered).timestamp(),
        )
    )
    h.states["X"] = state
    h.runs += list(runs)
    h.cancel_hooks = [Hook("X", "x", True) for _ in range(hooks)]
    return h


def test_a_cancelled_job_is_neither_lost_nor_stuck():
    assert check(cancelled("cancelled", "cancelled")) == {}
    assert check(cancelled("requested", "cancelled", runs=[run("X", "x", 1, 0, 1.5, ok=False)], hooks=1)) == {}
    assert check(cancelled(UNKNOWN, "cancelled")) == {}


def test_a_job_cancelled_while_waiting_never_starts_and_ends_cancelled():
    assert list(check(cancelled("cancelled", "cancelled", runs=[run("X", "x", 1, 1.5, 2)]))) == ["cancel"]
    assert "cancel" in check(cancelled("cancelled", "completed", runs=[run("X", "x", 1, 0, 0.5)]))
    # A run that began before the answer (a stale delivery, its job taken back) is no breach.
    assert "cancel" not in check(cancelled("cancelled", "cancelled", runs=[run("X", "x", 1, 0.5, 2, ok=False)]))


def test_a_held_job_whose_cancel_was_asked_starts_no_new_run():
    runs = [run("X", "x", 1, 0, 1.2, ok=False), run("X", "x", 2, 2, 3, ok=False)]
    assert list(check(cancelled("requested", "cancelled", runs=runs))) == ["cancel"]


def test_a_run_whose_start_preceded_the_cancel_may_begin_its_body_after_the_answer():
    # Seed 226143 on Redis under load: the delivery's fenced start came before the cancel was stored (so
    # "requested", and the start was not refused), its body's first line 0.1 s after the answer.
    runs = [run("X", "x", 1, 1.1, 1.7)]
    h = cancelled("requested", "cancelled", runs=runs)
    h.started["X"] = at(0.95).timestamp()
    assert check(h) == {}
    h = cancelled("cancelled", "cancelled", runs=runs)  # a stale delivery, started before it was taken back
    h.started["X"] = at(0.95).timestamp()
    assert check(h) == {}
    # The broker recorded a start after the answer: the stored cancel did not refuse it.
    h = cancelled("requested", "cancelled", runs=runs)
    h.started["X"] = at(1.08).timestamp()
    assert list(check(h)) == ["cancel"]
    # No start known (the record gone, or its clock stepped): the body's stamp is all there is.
    assert list(check(cancelled("requested", "cancelled", runs=runs))) == ["cancel"]


def test_a_job_ended_before_its_cancel_keeps_its_end():
    assert check(cancelled("finished", "completed", runs=[run("X", "x", 1, 0, 0.5)])) == {
        "lost": ["x (X) is completed but its effect is missing"]
    }
    assert list(check(cancelled("finished", "cancelled", runs=[run("X", "x", 1, 0, 0.5)]))) == ["cancel"]


def test_only_a_job_asked_to_cancel_ends_cancelled():
    h = clean()
    h.states["A"] = "cancelled"
    assert set(check(h)) == {"lost", "cancel"}


def test_a_cancel_hook_runs_at_most_once_and_only_for_a_job_that_ended_cancelled():
    ran = [run("X", "x", 1, 0, 1.5, ok=False)]
    assert list(check(cancelled("requested", "cancelled", runs=ran, hooks=2))) == ["doubled"]
    h = cancelled("requested", "failed", runs=ran, hooks=1)
    assert "cancel" in check(h)
    h = clean()
    h.cancel_hooks = [Hook("A", "a", True)]
    assert list(check(h)) == ["cancel"]


def test_a_cancelled_job_did_not_also_fail_or_complete():
    h = cancelled("requested", "cancelled", runs=[run("X", "x", 1, 0, 1.5, ok=False)])
    h.hooks.append(Hook("X", "x", True))
    assert list(check(h)) == ["doubled"]
    h = cancelled("requested", "cancelled", runs=[run("X", "x", 1, 0, 1.5, rid="rx")])
    h.effects.append(Effect("rx", "X", "x", 1, True))
    h.broker = "postgres"
    assert list(check(h)) == ["doubled"]
    h.broker = "redis"  # ctx.once applied the effect; the job then ended cancelled (its hook undoes it)
    assert check(h) == {}


def waiter(answers: list[str | None], signals=(), *, state="completed", runs=None, relaxed="") -> History:
    """A clean history plus job W, which waited 3 s for its event (first run at t=0) and got ``answers``
    (one run past the wait each), with ``signals``: (data, answered at, outcome)."""
    from tests.faults.history import Signal, WaitRow

    h = clean()
    req = Request("w", "fault.work.nudge", outcome=ACKED, job_ids=["W"], event="ev-w", wait_timeout=3.0)
    req.signals = [
        Signal(data, at(answered - 0.1).timestamp(), at(answered).timestamp(), outcome)
        for data, answered, outcome in signals
    ]
    req.wait_relaxed = relaxed
    h.requests.append(req)
    h.states["W"] = state
    if runs is None:
        runs = [run("W", "w", 1, 0, 0.1, ok=False)] + [
            run("W", "w", 2 + i, 3.5 + 2 * i, 4 + 2 * i, rid=f"rw{i}") for i in range(len(answers))
        ]
    h.runs += runs
    for i, answer in enumerate(answers):
        h.waits.append(WaitRow(f"rw{i}", "W", "w", 2 + i, "null" if answer is None else f'"{answer}"'))
        if i == 0:
            h.effects.append(Effect(f"rw{i}", "W", "w", 2 + i, True))
    return h


def test_a_wait_resumed_once_with_the_signal_sent_in_time_is_clean():
    assert check(waiter(["a"], [("a", 1.0, ACKED)])) == {}
    assert check(waiter([None])) == {}  # never signalled: the timeout resumes it with None
    assert check(waiter([None], [("a", 5.0, ACKED)])) == {}  # signalled after the timeout
    assert check(waiter(["a"], [("a", 5.0, ACKED)])) == {}  # ... yet before its resumed run asked
    assert check(waiter(["a"], [("a", 1.0, ACKED), ("b", 1.5, ACKED)])) == {}
    assert check(waiter([None], [("a", 1.0, UNKNOWN)])) == {}  # a signal that raised may be lost


def test_a_wait_that_timed_out_though_signalled_in_time_is_flagged():
    assert list(check(waiter([None], [("a", 1.0, ACKED)]))) == ["wait"]
    assert check(waiter([None], [("a", 1.0, ACKED)], relaxed="the broker's clock stepped")) == {}


def test_a_wait_must_get_the_first_kept_signal_and_nothing_no_signal_sent():
    assert list(check(waiter(["b"], [("a", 1.0, ACKED), ("b", 1.5, ACKED)]))) == ["wait"]
    assert list(check(waiter(["z"], [("a", 1.0, ACKED)]))) == ["wait"]


def test_a_wait_resumed_twice_is_flagged_unless_a_fault_may_have_lost_the_first_ack():
    h = waiter(["a", "a"], [("a", 1.0, ACKED)])
    assert list(check(h)) == ["wait"]
    h.fault_windows = [(at(3).timestamp(), at(6).timestamp())]
    assert check(h) == {}
    h.fault_windows = []
    h.process_windows = {h.runs[-2].pid: [(at(3.5).timestamp(), at(4.5).timestamp())]}  # its process killed
    assert check(h) == {}
    h.process_windows = {h.runs[-1].pid: [(at(3.5).timestamp(), at(4.5).timestamp())]}  # another's
    assert list(check(h)) == ["wait"]
    assert list(check(waiter(["a", None], [("a", 1.0, UNKNOWN)]))) == ["wait"]  # two answers: resolved twice


def test_a_waiter_still_awaiting_or_completed_without_its_wait_is_flagged():
    assert list(check(waiter([], state="awaiting", runs=[run("W", "w", 1, 0, 0.1, ok=False)]))) == ["wait"]
    h = waiter([], runs=[run("W", "w", 1, 0, 0.1, rid="rw0")])
    h.effects.append(Effect("rw0", "W", "w", 1, True))
    assert list(check(h)) == ["wait"]


def test_a_pool_census_short_once_then_full_is_no_leak_and_one_short_to_the_end_is():
    from tests.faults.campaign import census_problem

    stats = '{"pool_size": 20, "pool_available": 0}'
    # A leak is never returned: the last census is short too, and the pool counts what nobody holds.
    problem = census_problem("limits-1", [(3, 20, stats), (3, 20, stats)], 592, "completed", {})
    assert (
        problem is not None and "17 of 20 pool connections leaked" in problem and "censuses 3/20 then 3/20" in problem
    )
    # A pool that could not open its connections in time on a loaded machine fills up by the next census.
    assert census_problem("limits-1", [(3, 20, '{"pool_size": 4}'), (20, 20, None)], 592, "completed", {}) is None
    assert census_problem("limits-1", [(20, 20, None)], 5, "completed", {}) is None
    # No census at all, or one that did not complete: a worker that no longer completes work.
    assert "ended failed" in (census_problem("limits-1", [], 5, "failed", {"h": "failed"}) or "")
