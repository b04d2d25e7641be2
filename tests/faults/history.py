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
  time, unless the stale one fenced its effect and that effect rolled back
  (or both fenced and the job's effect applied once: ``ctx.once``).
- **hook**: a job that failed for good without exactly one completed hook
  (hooks run at least once; "completed" is the hook's effect, which the
  test's hook applies once per job with ``ctx.once`` where it can).
- **leaked**: a worker that met thousands of time limits around pool
  checkouts (the time-limits kind) could no longer hand out every
  connection of its pool, or no longer completed a job.
- **stuck**: anything active, waiting, delayed or reserved after the quiet
  period, or a job that is not in a terminal state.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter, defaultdict
from decimal import Decimal

TERMINAL = ("completed", "failed")

#: A request's outcome over all of its tries.
ACKED, UNKNOWN, REFUSED = "acked", "unknown", "refused"

KINDS = ("lost", "refused-ran", "doubled", "overlapping", "hook", "stuck", "ledger", "leaked")


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
    #: Job id -> "attempts N, error …" from the broker's record: why a job ended as it did.
    why: dict[str, str] = dataclasses.field(default_factory=dict)
    #: What the time-limits kind found wrong with a worker's pool (tests.faults.campaign, Stage._time_limits).
    pool_problems: list[str] = dataclasses.field(default_factory=list)


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
            if not (rolled_back or (a.fenced and b.fenced and once)):
                out["overlapping"].append(f"{job_id}: {_show(a)} and {_show(b)}")
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
    return {kind: found for kind, found in out.items() if found}


def _check_acked(req, job_id, h, runs_by_job, effects_by_job, hooks_by_job, charged, out) -> None:
    state = h.states.get(job_id, "missing")
    if state not in TERMINAL and state != "missing":
        out["stuck"].append(f"{req.token} ({job_id}) is {state}")
        return
    if req.poison:
        if state != "failed":
            out["lost"].append(f"{req.token} ({job_id}): an undecodable message ended {state}, not failed")
        return
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
            out["lost"].append(f"{req.token} ({job_id}) is completed but no run reached its end")
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


def _overlapping(runs: list[Run]) -> list[tuple[Run, Run]]:
    forever = dt.datetime.max.replace(tzinfo=dt.UTC)
    ordered = sorted(runs, key=lambda r: r.started)
    return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :] if b.started < (a.ended or forever)]


def _show(run: Run) -> str:
    end = run.ended.time().isoformat() if run.ended else "?"
    return f"[delivery {run.delivery} pid {run.pid} {run.started.time().isoformat()}..{end} ok={run.ok}]"


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
