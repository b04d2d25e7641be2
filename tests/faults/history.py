"""The fault campaign's record of what happened, and the checker that judges it.

Plain data and pure functions, no servers: :mod:`tests.faults.campaign`
gathers a :class:`History` from a run (the producer's requests and what
each call answered, the run log, the effect log, the hook log, the final
states, the ledger), and :func:`check` lists every anomaly in it. Unit
tests feed it synthetic histories (tests/unit/test_campaign_history.py),
so each rule is shown to fire.

The rules (issue 18):

- **lost**: a request whose enqueue was acknowledged (a definite "yes")
  did not end as planned: not terminal, the wrong state, ``completed``
  without a run that reached its end, without its effect or its charge.
- **refused-ran**: a request every try of which was refused with a
  definite "nothing was enqueued" has runs or a charge anyway (a lost
  reply or a partly applied batch reported as a refusal).
- **doubled**: a request became more than one job (unknown outcomes and
  retries included: at most one job per request and per key), a fenced
  effect applied twice, a final-failure hook completed twice or for a job
  that completed, a charge twice or with the wrong amount, balances off.
- **overlapping**: two deliveries of a job whose bodies ran at the same
  time, unless a fault that takes a lease was in force for the stale
  (earlier) one when the other started (:class:`LeaseFault`: its process
  paused, its host cut off, its worker group's clock off, a server crash,
  Redis at maxmemory, a failover) *and* the stale one fenced its effect and
  that effect rolled back (or both fenced and the job's effect applied
  once: ``ctx.once``). A step of the server's clock is no such fault:
  recovery must see it and declare nobody dead for it (issue 18, finding 7).
- **hook**: a job that failed for good without exactly one completed hook
  (hooks run at least once; "completed" is the hook's effect, which the
  test's hook applies once per job with ``ctx.once`` where it can).
- **leaked**: a worker that met thousands of time limits around pool
  checkouts (the time-limits kind) could no longer hand out every
  connection of its pool, or no longer completed a job.
- **stuck**: anything active, waiting, delayed or reserved after the quiet
  period, or a job that is not in a terminal state.

The control features (issues 18, 21):

- **cancel**: a job whose cancel was answered ``cancelled`` (it was waiting
  or delayed) or ``requested`` (a worker held it) has no run that started
  after that answer (a stored cancel ends the job at any later start, a
  retry's and a recovered delivery's too), unless the broker's record says
  its last start came before the answer (that run's body began late, after
  a start that preceded the cancel: a loaded host); one answered ``cancelled`` ends
  ``cancelled``; one answered ``requested`` ends ``cancelled``, or as
  planned when the run in progress reached its outcome before its holder
  heard of the cancel; one answered ``finished`` keeps its end (never
  ``cancelled``); only a job that was asked to cancel ends ``cancelled``. A
  cancel hook ran only for a job that ended ``cancelled``, and at most once
  (``doubled`` past that). A job that ended ``cancelled`` is neither lost
  nor stuck, and did not also end otherwise: no final-failure hook ran for
  it, and on Postgres no effect committed with its completion
  (``ctx.transaction``: that commit is the job's ``done``).
- **group-cap**: at no instant did more runs of one group hold their job
  than the capped queue's ``group_concurrency``. A run counts over
  [start, end] only when its body, after measuring its end, found its
  delivery still current (``held``): a delivery taken back (lease
  recovered after a pause, a partition, a server clock step) or handed on
  never becomes current again, so a held run had its slot all along; a
  fenced run (not current at its end) no longer had it, and the broker was
  right to hand the slot on. Runs whose end was never checked (killed,
  the server away) are not counted: the rule may miss a breach in which
  one took part, never flags a legal history. Each run counts over the
  part of its logged span it surely ran (its start and end are read to
  /proc/uptime's hundredth: one run's end and the next one's start in the
  same hundredth are not at once).

Event waits (issue 21): some jobs ``ctx.wait_for`` an event of their own
(their first run parks them, ``awaiting``) and the workload signals it
(``app.events.signal``, through the same lossy proxy) before the wait,
during it, after its timeout, twice, or never. Every run that gets past
the wait logs what it returned (``fault_waits``). **wait**:

- every run past the wait of one job got the same answer (the resolution
  is stored insert-first: a second resume or a replay never sees another);
- the answer is None (the timeout) or the data of a signal that was sent
  for its name (acknowledged or of unknown outcome): no answer from nowhere;
- a signal acknowledged before the wait's timeout could have passed
  (earlier than the job's first run's start + its timeout) resumes it with
  data, the first signal's when that one was acknowledged (signals are kept
  ``CONVEYOR_EVENT_TTL_SECONDS``, here a day, and the first one kept wins);
  not required when the broker's clock stepped or a worker whose clock was
  off ran meanwhile (a wait's timeout is a delay: measured on those clocks),
  or its queue's Redis Cluster primary was killed within a second of the
  signal's answer (WAIT covers enqueues and claims, not signals);
- a completed waiter has a run past its wait, and none is still
  ``awaiting`` after the quiet period (its timeout passed long before);
- resumed once: no run past the wait starts after another one reached its
  end, unless a fault was in force around that end that may have lost its
  ack (its own process killed or stopped, the host cut off, a server away
  or its clock stepped: at-least-once delivery runs it again).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import Counter, defaultdict
from decimal import Decimal

TERMINAL = ("completed", "failed", "cancelled")

#: A request's outcome over all of its tries.
ACKED, UNKNOWN, REFUSED = "acked", "unknown", "refused"

KINDS = (
    "lost",
    "refused-ran",
    "doubled",
    "overlapping",
    "hook",
    "stuck",
    "ledger",
    "leaked",
    "cancel",
    "group-cap",
    "wait",
)

#: Cancel answers (conveyor.brokers.base.CancelOutcome) and UNKNOWN (the call raised).
CANCELLED, REQUESTED, FINISHED = "cancelled", "requested", "finished"

#: Seconds of slack between a run's start (the host's boot clock, mapped to UTC once) and a cancel's
#: answer (UTC): /proc/uptime's resolution and the mapping.
CLOCK_SLACK = 0.05

#: Seconds /proc/uptime counts in (tests.faults.jobs.UPTIME_RESOLUTION): a run's logged start may be this
#: much before its true start, its logged end this much after its true end.
UPTIME_RESOLUTION = dt.timedelta(seconds=0.01)

#: Seconds of slack on a wait's window: a signal answered this much before the wait's earliest possible
#: timeout must have resumed it with data.
WAIT_SLACK = 0.5


@dataclasses.dataclass
class Signal:
    """One ``app.events.signal`` call of the workload: its data, UNIX seconds sent and answered, and
    ACKED (it returned) or UNKNOWN (it raised: it may or may not have been stored)."""

    data: str
    sent: float
    answered: float
    outcome: str


@dataclasses.dataclass
class WaitRow:
    """One run that got past its ``ctx.wait_for``, and what it returned (JSON text)."""

    run_id: str
    job_id: str
    token: str
    delivery: int | None
    data: str


@dataclasses.dataclass
class Request:
    """One logical job the producer asked for (a retried or repeated request keeps its token)."""

    token: str
    job: str
    key: str | None = None
    #: "completed" or "failed" (fails for good; its hook must complete once).
    expect: str = "completed"
    #: The body writes to the run and effect logs (credit.consume does not).
    logged: bool = True
    #: (ledger reference, user, amount charged) when the job charges.
    charge: tuple[str, str, Decimal] | None = None
    #: ACKED when some try was answered with a job id, UNKNOWN when some try's outcome is unknown
    #: (and none was answered), REFUSED when every try was refused ("nothing was enqueued").
    outcome: str = REFUSED
    job_ids: list[str] = dataclasses.field(default_factory=list)
    #: UNIX seconds of the first try and of the last answer; tries spanning more than the key's
    #: dedup window may legitimately make two jobs of one key.
    first_sent: float = 0.0
    last_sent: float = 0.0
    #: The stored message was made undecodable on purpose (poison): it must fail, not stay active.
    poison: bool = False
    #: The broker's server clock stepped while this request's tries went out: its key's dedup window
    #: (server time) may have passed at once, so a second job of the key is no anomaly.
    clock_stepped: bool = False
    #: Runs the body asks for before the one that ends it, each re-enqueued by a user's middleware
    #: (the user-retries kind): it must run at least that many times + 1, and not loop.
    polls: int = 0
    #: Its fair-share group on the capped queue (None: not a grouped job), and its priority.
    group: str | None = None
    priority: int = 0
    #: The workload's cancel of its (first) job: the answer (CANCELLED, REQUESTED, FINISHED, or UNKNOWN
    #: when the call raised), and UNIX seconds it was sent and answered; None: never cancelled.
    cancel: str | None = None
    cancel_sent: float = 0.0
    cancel_answered: float = 0.0
    cancel_error: str = ""
    #: A waiter: the event it waits for (None: not a waiter), the wait's timeout, the signals sent for
    #: it, and why a signal in time need not have reached it ("": it must have).
    event: str | None = None
    wait_timeout: float = 0.0
    signals: list[Signal] = dataclasses.field(default_factory=list)
    wait_relaxed: str = ""


@dataclasses.dataclass
class Run:
    """One body run, from the run log: times on the database server's clock (start) + its own elapsed time."""

    run_id: str
    job_id: str
    token: str
    delivery: int | None
    pid: int
    started: dt.datetime
    #: None: the end was never learnt (counts as still running).
    ended: dt.datetime | None
    ok: bool | None
    #: The body wrote its effect through a fence (ctx.once / transactional completion).
    fenced: bool = False
    #: Its delivery was still current when its end had been measured (grouped jobs; None: not asked or
    #: no answer): it held its job, and its group's slot, from start to end.
    held: bool | None = None
    #: The worker group it ran in (the run log's host: ``near0``, ``far1``, ``skewed5``, …).
    host: str = ""


@dataclasses.dataclass
class Effect:
    """A committed row of the effect log (non-idempotent: every applied effect is one row)."""

    run_id: str
    job_id: str
    token: str
    delivery: int | None
    fenced: bool


@dataclasses.dataclass
class Hook:
    """One run of a final-failure hook; ``completed`` once it reached its end."""

    job_id: str
    token: str | None
    completed: bool


@dataclasses.dataclass(frozen=True)
class LeaseFault:
    """A fault that may take a running delivery's lease from it (recovery hands the job to another
    worker while the first run goes on): a run of the ``pid`` (a pause), of the ``host`` (a partition, a
    group with its clock off), or of any worker (both None: a server crash, maxmemory, a failover) may
    overlap its job's next delivery if that one started within [``began``, ``ended``] (UNIX seconds: the
    fault's start less 1 s to its end plus a lease, a recovery pass and 3 s)."""

    kind: str
    began: float
    ended: float
    pid: int | None = None
    host: str | None = None

    def covers(self, stale: Run, at: dt.datetime) -> bool:
        """Whether this fault was in force for ``stale`` when the delivery that overlaps it started (``at``)."""
        if self.pid is not None and stale.pid != self.pid:
            return False
        if self.host is not None and stale.host != self.host:
            return False
        return self.began <= at.timestamp() <= self.ended


@dataclasses.dataclass
class History:
    requests: list[Request]
    runs: list[Run]
    effects: list[Effect]
    hooks: list[Hook]
    #: Job id -> state at the end (after the quiet period); "missing" when the broker has no record.
    states: dict[str, str]
    #: Queue -> (waiting, delayed, active) at the end.
    leftovers: dict[str, tuple[int, int, int]]
    #: Broker structures that hold a message for a worker, -> how many still do at the end (Redis: each
    #: worker's un-settled set ``__acks__.*`` and each queue's message hash ``*.msgs``).
    reserved: dict[str, int] = dataclasses.field(default_factory=dict)
    #: (reference, user, amount) of every ledger consume entry, and the balances.
    entries: list[tuple[str, str, Decimal]] = dataclasses.field(default_factory=list)
    balances: dict[str, Decimal] = dataclasses.field(default_factory=dict)
    #: ``conveyor ledger verify``'s complaint, "" when it agreed.
    verify: str = ""
    #: Seconds a key deduplicates.
    dedup_ttl: float = 4.0
    #: Job id -> UNIX seconds of the broker's last recorded start of the job (its record's ``started_at``,
    #: on the server's clock, written by the fenced start that refuses a job whose cancel is stored);
    #: absent when unknown, or when that clock may have been stepped then.
    started: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Job id -> "attempts N, error …" from the broker's record: why a job ended as it did.
    why: dict[str, str] = dataclasses.field(default_factory=dict)
    #: What the time-limits kind found wrong with a worker's pool (tests.faults.campaign, Stage._time_limits).
    pool_problems: list[str] = dataclasses.field(default_factory=list)
    #: One per run of a cancel hook (``on_cancel``).
    cancel_hooks: list[Hook] = dataclasses.field(default_factory=list)
    #: The capped queue's group_concurrency (0: no grouped jobs).
    group_cap: int = 0
    #: "redis" or "postgres": on Postgres a fenced effect commits with the job's completion.
    broker: str = ""
    #: One row per run that got past its wait.
    waits: list[WaitRow] = dataclasses.field(default_factory=list)
    #: (UNIX start, end) of each fault the nemesis applied to a server or the network (a crash, a cut, a
    #: server clock step, maxmemory), widened by the time a lost ack takes to be recovered: a run that
    #: ended in one may run again (at-least-once).
    fault_windows: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    #: Worker pid -> (UNIX start, end) of each fault to that process (a SIGKILL, a SIGSTOP to its SIGCONT),
    #: widened likewise: a run of it that ended in one may have lost its ack.
    process_windows: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    #: The faults that may have taken a running delivery's lease (see **overlapping**).
    lease_faults: list[LeaseFault] = dataclasses.field(default_factory=list)


def check(h: History) -> dict[str, list[str]]:
    """Every anomaly in ``h``, by kind (see the module docstring); empty lists are left out."""
    out: dict[str, list[str]] = defaultdict(list)
    runs_by_token: dict[str, list[Run]] = defaultdict(list)
    runs_by_job: dict[str, list[Run]] = defaultdict(list)
    for run in h.runs:
        runs_by_token[run.token].append(run)
        runs_by_job[run.job_id].append(run)
    effects_by_job: dict[str, list[Effect]] = defaultdict(list)
    for effect in h.effects:
        effects_by_job[effect.job_id].append(effect)
    hooks_by_job: dict[str, list[Hook]] = defaultdict(list)
    for hook in h.hooks:
        hooks_by_job[hook.job_id].append(hook)
    charged = Counter(ref for ref, _, _ in h.entries)

    for req in h.requests:
        ran = runs_by_token.get(req.token, [])
        jobs = set(req.job_ids) | {r.job_id for r in ran}
        window = req.last_sent - req.first_sent <= h.dedup_ttl * 0.75
        if len(jobs) > 1 and (req.key is None or (window and not req.clock_stepped)):
            out["doubled"].append(f"{req.token}: one request became {len(jobs)} jobs {sorted(jobs)} ({req.outcome})")
        if req.outcome == REFUSED:
            if ran:
                out["refused-ran"].append(f"{req.token}: refused ('nothing was enqueued') yet ran: {ran[0]}")
            if req.charge and charged.get(req.charge[0]):
                out["refused-ran"].append(f"{req.token}: refused ('nothing was enqueued') yet charged")
            continue
        if req.outcome == UNKNOWN:
            continue  # may or may not exist: at most one job (above), its charge at most once (below)
        if not req.job_ids:
            out["lost"].append(f"{req.token}: acknowledged, yet no job ran")
        for job_id in req.job_ids[:1]:
            _check_acked(req, job_id, h, runs_by_job, effects_by_job, hooks_by_job, charged, out)

    for job_id, runs in runs_by_job.items():
        effects = effects_by_job.get(job_id, [])
        # Both fenced and the job's effect applied at most once (ctx.once): the overlap did no harm.
        once = len(effects) <= 1 and all(e.fenced for e in effects)
        for a, b in _overlapping(runs):
            stale = a if (a.delivery or 0) <= (b.delivery or 0) else b
            rolled_back = stale.fenced and not any(e.run_id == stale.run_id for e in effects)
            harmless = rolled_back or (a.fenced and b.fenced and once)
            # Only a fault that took the stale delivery's lease may hand its job on while it runs.
            taken = [f for f in h.lease_faults if f.covers(stale, b.started)]
            if not (harmless and taken):
                why = "its effect applied" if not harmless else "no fault took its lease"
                out["overlapping"].append(f"{job_id}: {_show(a)} and {_show(b)} ({why})")
                break

    for job_id, effects in effects_by_job.items():
        fenced = [e for e in effects if e.fenced]
        if len(fenced) > 1:
            out["doubled"].append(
                f"{job_id}: fenced effect applied {len(fenced)} times (deliveries {[e.delivery for e in fenced]})"
            )

    for queue, (waiting, delayed, active) in sorted(h.leftovers.items()):
        if waiting or delayed or active:
            out["stuck"].append(f"queue {queue}: {waiting} waiting, {delayed} delayed, {active} active at the end")

    for where, n in sorted(h.reserved.items()):
        if n:
            out["stuck"].append(f"{where}: {n} message(s) still reserved or stored at the end")

    out["ledger"] += _ledger(h, charged)
    out["leaked"] += h.pool_problems
    _check_cancels(h, runs_by_job, effects_by_job, hooks_by_job, out)
    _check_waits(h, runs_by_job, out)
    for group, (peak, during) in sorted(group_peaks(h).items()):
        if h.group_cap and peak > h.group_cap:
            out["group-cap"].append(
                f"group {group}: {peak} held runs at once, cap {h.group_cap}: " + " ".join(_show(r) for r in during)
            )
    return {kind: found for kind, found in out.items() if found}


def _check_acked(req, job_id, h, runs_by_job, effects_by_job, hooks_by_job, charged, out) -> None:
    state = h.states.get(job_id, "missing")
    if state == "awaiting" and req.event:
        return  # the wait rule says why
    if state not in TERMINAL and state != "missing":
        out["stuck"].append(f"{req.token} ({job_id}) is {state}")
        return
    if req.poison:
        if state != "failed":
            out["lost"].append(f"{req.token} ({job_id}): an undecodable message ended {state}, not failed")
        return
    if state == CANCELLED and req.cancel is not None:
        return  # asked to cancel and did: not lost (what else must hold: _check_cancels)
    if state != req.expect:
        runs = " ".join(_show(r) for r in sorted(runs_by_job.get(job_id, []), key=lambda r: r.started))
        why = f" ({h.why.get(job_id, 'no record')}; runs {runs or 'none'})"
        out["lost"].append(f"{req.token} ({job_id}) ended {state}, expected {req.expect}{why}")
        return
    completed_hooks = [x for x in hooks_by_job.get(job_id, []) if x.completed]
    if req.expect == "completed":
        # A fenced effect commits with the job's completion (ctx.transaction): a run killed right after
        # that commit reached its end as far as the job is concerned.
        done = any(r.ok for r in runs_by_job.get(job_id, [])) or any(e.fenced for e in effects_by_job.get(job_id, []))
        if req.logged and not done:
            runs = " ".join(_show(r) for r in sorted(runs_by_job.get(job_id, []), key=lambda r: r.started))
            cancel = f"; cancel {req.cancel}" if req.cancel else ""
            out["lost"].append(
                f"{req.token} ({job_id}) is completed but no run reached its end ({h.why.get(job_id, 'no record')}; "
                f"runs {runs or 'none'}{cancel})"
            )
        if req.logged and not effects_by_job.get(job_id):
            out["lost"].append(f"{req.token} ({job_id}) is completed but its effect is missing")
        if req.charge and not charged.get(req.charge[0]):
            out["lost"].append(f"{req.token} ({job_id}) is completed but its charge is missing")
        if hooks_by_job.get(job_id):
            out["doubled"].append(f"{req.token} ({job_id}) completed, yet its final-failure hook ran")
        if req.polls:
            runs = runs_by_job.get(job_id, [])
            ok = sum(1 for r in runs if r.ok)
            if ok < req.polls + 1:
                out["lost"].append(
                    f"{req.token} ({job_id}) asked for {req.polls} more run(s), ran to its end {ok} time(s)"
                )
            if len(runs) > 2 * (req.polls + 1) + 2:
                out["doubled"].append(f"{req.token} ({job_id}) looped: {len(runs)} runs for {req.polls} re-enqueue(s)")
    elif len(completed_hooks) != 1:
        kind = "doubled" if len(completed_hooks) > 1 else "hook"
        out[kind].append(
            f"{req.token} ({job_id}) failed for good; {len(completed_hooks)} completed hook(s) "
            f"of {len(hooks_by_job.get(job_id, []))} started"
        )


def _check_cancels(h: History, runs_by_job, effects_by_job, hooks_by_job, out) -> None:
    """The cancel rules (see the module docstring)."""
    asked: dict[str, Request] = {}
    for req in h.requests:
        if req.job_ids and req.outcome != REFUSED:
            asked.setdefault(req.job_ids[0], req)
    for job_id, req in asked.items():
        state = h.states.get(job_id, "missing")
        runs = sorted(runs_by_job.get(job_id, []), key=lambda r: r.started)
        if req.cancel is None:
            if state == CANCELLED:
                out["cancel"].append(f"{req.token} ({job_id}) ended cancelled, yet no cancel was asked")
            continue
        if req.cancel in (CANCELLED, REQUESTED):
            answered = dt.datetime.fromtimestamp(req.cancel_answered + CLOCK_SLACK, dt.UTC)
            late = [r for r in runs if r.started > answered]
            # A body's first line comes after its delivery's start (the fenced write that would have
            # refused it): on a loaded host the gap can pass the answer. The broker's last recorded start
            # at or before the answer vouches that every start, these runs' included, preceded the cancel.
            start = h.started.get(job_id)
            if late and start is not None and start <= req.cancel_answered + CLOCK_SLACK:
                late = []
            if late:
                out["cancel"].append(
                    f"{req.token} ({job_id}): cancel answered {req.cancel} at "
                    f"{dt.datetime.fromtimestamp(req.cancel_answered, dt.UTC).time()}, yet a run started after: "
                    + _show(late[0])
                )
        if req.cancel == CANCELLED and state not in (CANCELLED, "missing"):
            out["cancel"].append(f"{req.token} ({job_id}): cancelled while waiting, yet it ended {state}")
        if req.cancel == FINISHED and state == CANCELLED:
            out["cancel"].append(f"{req.token} ({job_id}): had ended before its cancel, yet it ended cancelled")
        if state == CANCELLED:
            if hooks_by_job.get(job_id):
                out["doubled"].append(f"{req.token} ({job_id}) ended cancelled, yet its final-failure hook ran")
            if h.broker == "postgres" and any(e.fenced for e in effects_by_job.get(job_id, [])):
                out["doubled"].append(f"{req.token} ({job_id}) ended cancelled, yet its completion committed")
    cancel_hooks = Counter(x.job_id for x in h.cancel_hooks)
    for job_id, n in sorted(cancel_hooks.items()):
        req = asked.get(job_id)
        token = req.token if req else "?"
        state = h.states.get(job_id, "missing")
        if n > 1:
            out["doubled"].append(f"{token} ({job_id}): cancel hook ran {n} times")
        if req is None or req.cancel is None:
            out["cancel"].append(f"{token} ({job_id}): cancel hook ran, yet no cancel was asked")
        elif state != CANCELLED:
            out["cancel"].append(f"{token} ({job_id}): cancel hook ran, yet it ended {state}")


def _check_waits(h: History, runs_by_job, out) -> None:
    """The event-wait rules (see the module docstring)."""
    rows_by_job: dict[str, list[WaitRow]] = defaultdict(list)
    for row in h.waits:
        rows_by_job[row.job_id].append(row)
    for req in h.requests:
        if not req.event or not req.job_ids or req.outcome == REFUSED:
            continue
        job_id = req.job_ids[0]
        state = h.states.get(job_id, "missing")
        rows = rows_by_job.get(job_id, [])
        runs = sorted(runs_by_job.get(job_id, []), key=lambda r: r.started)
        where = f"{req.token} ({job_id}, event {req.event}, timeout {req.wait_timeout:g} s)"
        if state == "awaiting":
            out["wait"].append(f"{where} is still awaiting after the quiet period")
            continue
        if state == "completed" and not rows:
            out["wait"].append(f"{where} completed, yet no run got past its wait")
        answers = sorted({row.data for row in rows})
        if len(answers) > 1:
            out["wait"].append(f"{where} resumed with different answers {answers}: resolved twice")
        sent = {json.dumps(s.data) for s in req.signals if s.outcome != REFUSED}
        for answer in answers:
            if answer != "null" and answer not in sent:
                out["wait"].append(f"{where} got {answer}, which no signal of its event sent")
        if runs and rows and not req.wait_relaxed:
            deadline = runs[0].started.timestamp() + req.wait_timeout - WAIT_SLACK
            due = [s for s in sorted(req.signals, key=lambda s: s.sent) if s.outcome == ACKED and s.answered < deadline]
            first = min(req.signals, key=lambda s: s.sent) if req.signals else None
            if due and "null" in answers:
                out["wait"].append(
                    f"{where} timed out, yet a signal was acknowledged {deadline + WAIT_SLACK - due[0].answered:.1f} s"
                    " before its timeout could pass"
                )
            elif due and first and first.outcome == ACKED and answers and answers != [json.dumps(first.data)]:
                out["wait"].append(f"{where} got {answers}, not the first signal's {first.data!r} (kept, it wins)")
        past = sorted((r for r in runs if r.ok and any(w.run_id == r.run_id for w in rows)), key=lambda r: r.started)
        for a, b in zip(past, past[1:]):
            if a.ended is None or b.started < a.ended:
                continue  # overlapping runs are the overlapping rule's
            end = a.ended.timestamp()
            windows = h.fault_windows + h.process_windows.get(a.pid, [])
            if not any(began <= end <= ended for began, ended in windows):
                out["wait"].append(
                    f"{where} resumed again: {_show(b)} got past the wait after {_show(a)} had completed it,"
                    " no fault in force at that end"
                )
                break


def group_peaks(h: History) -> dict[str, tuple[int, list[Run]]]:
    """Group -> (the most runs of it that held their job at one instant, those runs): see **group-cap**."""
    group_of = {req.token: req.group for req in h.requests if req.group is not None}
    events: dict[str, list[tuple[dt.datetime, int, Run]]] = defaultdict(list)
    for run in h.runs:
        group = group_of.get(run.token)
        if group is None or run.held is not True or run.ended is None:
            continue
        began, ended = run.started + UPTIME_RESOLUTION, run.ended - UPTIME_RESOLUTION
        if began < ended:
            events[group] += [(began, 1, run), (ended, -1, run)]
    out: dict[str, tuple[int, list[Run]]] = {}
    for group, points in events.items():
        points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
        live: list[Run] = []
        peak, during = 0, []
        for _, step, run in points:
            if step > 0:
                live.append(run)
            else:
                live.remove(run)
            if len(live) > peak:
                peak, during = len(live), list(live)
        out[group] = (peak, during)
    return out


def _overlapping(runs: list[Run]) -> list[tuple[Run, Run]]:
    forever = dt.datetime.max.replace(tzinfo=dt.UTC)
    ordered = sorted(runs, key=lambda r: r.started)
    return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :] if b.started < (a.ended or forever)]


def _show(run: Run) -> str:
    end = run.ended.time().isoformat() if run.ended else "?"
    where = f"{run.host}/{run.pid}" if run.host else f"pid {run.pid}"
    return f"[delivery {run.delivery} {where} {run.started.time().isoformat()}..{end} ok={run.ok}]"


def _ledger(h: History, charged: Counter[str]) -> list[str]:
    """Charges: each acknowledged one exactly once, unknown ones at most once, refused ones never; amounts,
    balances and ``conveyor ledger verify`` exact."""
    problems: list[str] = []
    known = {req.charge[0]: req for req in h.requests if req.charge}
    for ref, n in charged.items():
        if n > 1:
            problems.append(f"{ref} charged {n} times")
        if ref not in known:
            problems.append(f"{ref} charged, but no request named it")
    expected: dict[str, Decimal] = defaultdict(Decimal)
    for ref, user, amount in h.entries:
        req = known.get(ref)
        if req is None or req.charge is None:
            continue
        if amount != -req.charge[2]:
            problems.append(f"{ref}: amount {amount} != {-req.charge[2]}")
        expected[user] += amount
    for user, value in sorted(expected.items()):
        if h.balances.get(user, Decimal(0)) != value:
            problems.append(f"{user}: balance {h.balances.get(user)} != {value}")
    if h.verify:
        problems.append(f"conveyor ledger verify: {h.verify}")
    return problems
