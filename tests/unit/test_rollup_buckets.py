"""The rollup's log-scale buckets: any duration lands in one, percentiles of merged buckets are within a bucket."""

from __future__ import annotations

import random

from conveyor.brokers.rollup import BUCKETS, Tally, bucket_of, percentile
from conveyor.brokers.rollup.base import bucket_value


def test_every_duration_has_a_bucket_whose_value_is_within_a_fifth_of_it():
    assert bucket_of(0) == 0 and bucket_of(1e9) == BUCKETS - 1
    for seconds in (0.0011, 0.004, 0.05, 0.3, 1, 7.5, 60, 900, 3600):
        value = bucket_value(bucket_of(seconds))
        assert abs(value - seconds) / seconds < 0.2, (seconds, value)


def test_percentiles_of_two_processes_merged_buckets_are_those_of_all_their_samples():
    rng = random.Random(7)
    samples = [rng.lognormvariate(-3, 1.2) for _ in range(4000)]
    a, b = Tally(), Tally()
    for i, s in enumerate(samples):
        (a if i % 2 else b).run[bucket_of(s)] += 1
    a.add(b)
    ordered = sorted(samples)
    for q in (0.5, 0.95):
        exact = ordered[int(q * len(ordered))]
        got = percentile(a.run, q)
        assert got is not None and abs(got - exact) / exact < 0.25, (q, exact, got)
    assert percentile(Tally().run, 0.5) is None
