"""The fault campaign: a fixed set of seeds on both brokers, or the one seed ``CAMPAIGN_SEED`` names.

Each seed draws a workload and a schedule of faults (tests/faults/nemesis.py),
runs them on real workers against private servers, and checks the history
(tests/faults/history.py). A failing run prints its seed and schedule;
``CAMPAIGN_SEED=<seed> pytest tests/faults/test_campaign.py`` replays it
(``CAMPAIGN_ALL_FAULTS=1`` adds the kinds still pending a fix, ``CAMPAIGN_KINDS=pause,kill`` draws
from those kinds alone,
``CAMPAIGN_JOBS`` / ``CAMPAIGN_FAULTS`` / ``CAMPAIGN_WINDOW`` resize it).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.faults import campaign, history, nemesis, report
from tests.support.brokers import SERVER_BROKERS

#: The CI seeds: each broker runs every one; together they draw every fault kind on both brokers
#: (tests/unit/test_campaign_history.py checks it) (about 35-60 s each on 2 cores). With time-limits and
#: user-retries in, no three seeds below 400 but (0, 11, 358), (2, 10, 307), (10, 20, 394) and six more do.
CI_SEEDS = (2, 10, 307)

#: The CI seeds of the third broker, Redis Cluster with a replica per primary (campaign.CLUSTER): seed 3
#: draws three failovers (its own kind) beside kill and old-worker; about 50 s.
CLUSTER_SEEDS: tuple[int, ...] = (3,)

#: Every broker a campaign seed runs on.
BROKERS = (*SERVER_BROKERS, campaign.CLUSTER)


def cases() -> list[tuple[str, int]]:
    """(broker, seed) pairs: ``CAMPAIGN_SEED``'s seeds on every broker, else the CI seeds."""
    chosen = os.environ.get("CAMPAIGN_SEED")
    if chosen:
        return [(broker, int(s)) for s in chosen.split(",") for broker in BROKERS]
    return [(broker, seed) for seed in CI_SEEDS for broker in SERVER_BROKERS] + [
        (campaign.CLUSTER, seed) for seed in CLUSTER_SEEDS
    ]


def size() -> campaign.Size:
    base = campaign.CI
    return campaign.Size(
        jobs=int(os.environ.get("CAMPAIGN_JOBS", base.jobs)),
        faults=int(os.environ.get("CAMPAIGN_FAULTS", base.faults)),
        window=float(os.environ.get("CAMPAIGN_WINDOW", base.window)),
    )


def replay(seed: int) -> str:
    """The environment that replays ``seed`` as this run drew it."""
    knobs = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("CAMPAIGN_") and k != "CAMPAIGN_SEED")
    return " ".join([f"CAMPAIGN_SEED={seed}", *knobs])


@pytest.fixture(scope="module")
def servers():
    made = campaign.Servers()
    try:
        yield made
    finally:
        made.close()


#: Seconds one seed may take: the run (about 150 s on a 2-core host at a load of 40), the wait for a slow
#: backlog (campaign.BACKLOG_GRACE), the workers' drain before the history is read, and the teardown.
#: pyproject's 180 s cut seeds 226143 and 420780 on redis-cluster short in their teardown under load.
SEED_TIMEOUT = 480


@pytest.mark.timeout(SEED_TIMEOUT)
@pytest.mark.parametrize(("broker", "seed"), cases())
def test_campaign_seed_keeps_every_guarantee(servers, tmp_path, broker, seed):
    everything = os.environ.get("CAMPAIGN_ALL_FAULTS") == "1"
    kinds = nemesis.kinds_for(broker, everything=everything)
    only = [k for k in os.environ.get("CAMPAIGN_KINDS", "").split(",") if k]
    if only:  # one kind against today's code: how many seeds it needs to find its defect
        kinds = [k for k in only if k in nemesis.kinds_for(broker, everything=everything)]
        if not kinds:
            pytest.skip(f"none of {only} applies to {broker}")
    outcome = campaign.run(servers, tmp_path, broker, seed, size(), kinds)
    row = report.record_campaign(outcome, all_faults=everything)
    lines = [
        f"seed {seed} on {broker}: replay with {replay(seed)} .venv/bin/python -m pytest tests/faults/test_campaign.py",
        f"{row.jobs} jobs acknowledged, {row.unknown} unknown, {row.refused} refused; {row.runs} body runs, "
        f"{row.effects} effects, {row.hooks} hooks; producer errors {outcome.producer_errors}; {row.seconds:.0f} s",
        f"cancels {dict(Counter(r.cancel for r in outcome.history.requests if r.cancel))}, "
        f"{len(outcome.history.cancel_hooks)} cancel hooks, ended cancelled "
        f"{sum(1 for s in outcome.history.states.values() if s == 'cancelled')}; held runs at once per group "
        f"{ {g: p for g, (p, _) in sorted(history.group_peaks(outcome.history).items())} } "
        f"(cap {outcome.history.group_cap})",
        f"waiters {sum(1 for r in outcome.history.requests if r.event)}, answers "
        f"{dict(Counter('none' if w.data == 'null' else 'data' for w in outcome.history.waits))}, signals "
        f"{dict(Counter(s.outcome for r in outcome.history.requests for s in r.signals))}, relaxed "
        f"{sum(1 for r in outcome.history.requests if r.wait_relaxed)}",
        "schedule:",
    ]
    lines += [f"  {a.fault}  [{a.note}]" if a.note else f"  {a.fault}" for a in outcome.applied]
    for kind, found in outcome.anomalies.items():
        lines.append(f"{kind} ({len(found)}):")
        lines += [f"  {x}" for x in found[:8]]
    print("\n".join(lines))
    assert not outcome.anomalies, "\n".join(lines)
