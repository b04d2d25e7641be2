"""What a budget costs a job: one admission (admitted or refused) and one ``ctx.spend``, per store.

    .venv/bin/python bench/budgets.py [--calls 2000]

On private Redis and Postgres servers (bench/servers.py), one thread calls the
budget store ``--calls`` times per case, each a one-budget admission of weight 1:
``admitted`` (a limit no call reaches), ``refused`` (a window already full of
100 entries, so the refusal walks them to compute the wait), and ``spend``.
Prints one JSON line per store and case with the median and p99 in
microseconds. The machine's other load moves these figures: compare within
one run. The overshoot under contention is not a speed: it is asserted by
tests/integration/test_budget_stores.py and reported in docs/budgets.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import Servers  # noqa: E402
from conveyor.budgets.base import BudgetStore, Take  # noqa: E402
from conveyor.schema.migrate import migrate  # noqa: E402
from tests.support.budget_load import open_store  # noqa: E402


def timed(call, calls: int) -> dict[str, float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1e6)
    samples.sort()
    return {"median_us": round(statistics.median(samples), 1), "p99_us": round(samples[int(len(samples) * 0.99)], 1)}


def cases(store: BudgetStore, calls: int) -> dict[str, dict[str, float]]:
    out = {"admitted": timed(lambda: store.take([Take("bench:open", 1e12, 60, 1)]), calls)}
    for _ in range(100):
        store.take([Take("bench:full", 100, 600, 1)])
    out["refused"] = timed(lambda: store.take([Take("bench:full", 100, 600, 1)]), calls)
    out["spend"] = timed(lambda: store.spend(Take("bench:spent", 1e12, 60, 1)), calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    with Servers.start() as servers:
        url = servers.fresh_database("budgets")
        migrate(url)
        for name, target in (("redis", servers.redis_url), ("postgres", url)):
            store = open_store(name, target)
            try:
                for case, figures in cases(store, args.calls).items():
                    print(json.dumps({"store": name, "case": case, "calls": args.calls, **figures}), flush=True)
            finally:
                store.close()
                if name == "postgres":
                    store.pool.close()  # type: ignore[attr-defined]  (the bench's own pool)


if __name__ == "__main__":
    main()
