"""Budgets without a server: the declaration, the admission rule, and the in-process store (the inline broker's)."""

from __future__ import annotations

import pytest

from conveyor import Budget, Jobs, Payload, Queue
from conveyor.budgets.base import Take, admits
from conveyor.budgets.memory import MemoryBudgets


class Call(Payload):
    provider_key: str = "k1"
    max_tokens: int = 100


def test_a_budget_reads_its_key_and_weight_from_a_field_or_a_function():
    by_field = Budget("provider-tokens", limit=90_000, per=60, key="provider_key", weight="max_tokens")
    by_function = Budget("provider-tokens", limit=90_000, key=lambda p: p.provider_key, weight=lambda p: p.max_tokens)
    call = Call(provider_key="k2", max_tokens=700)
    assert by_field.key_of(call) == by_function.key_of(call) == "provider-tokens:k2"
    assert by_field.weight_of(call) == by_function.weight_of(call) == 700
    requests = Budget("provider-requests", limit=500)
    assert requests.key_of(call) == "provider-requests" and requests.weight_of(call) == 1
    assert Budget("report-only", limit=10, weight=0).weight_of(call) == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(name="Bad Name", limit=1),
        dict(name="ok", limit=0),
        dict(name="ok", limit=1, per=0),
        dict(name="ok", limit=1, per=2 * 24 * 3600),
    ],
)
def test_a_budget_that_cannot_work_is_refused_where_it_is_declared(bad):
    with pytest.raises(ValueError):
        Budget(**bad)


def test_a_negative_weight_is_refused():
    with pytest.raises(ValueError):
        Budget("b", limit=10, weight=lambda p: -1).weight_of(Call())


def test_budgets_are_declared_on_a_queue_and_a_job_type_and_combined():
    jobs = Jobs()
    per_key = Budget("requests", limit=500, key="provider_key")
    llm = Queue("llm", budgets=[per_key])
    tokens = Budget("tokens", limit=90_000, weight="max_tokens")

    @jobs.job("call", queue=llm, payload=Call, budgets=[tokens])
    def call(payload: Call, ctx) -> None: ...

    job_type = jobs.job_types["call"]
    assert [b.name for b in job_type.all_budgets(llm)] == ["requests", "tokens"]
    with pytest.raises(ValueError):
        Queue("twice", budgets=[per_key, per_key])


def test_the_admission_rule_keeps_the_limit_and_lets_a_heavy_job_run_alone():
    assert admits(0, 5, 10) and admits(5, 5, 10) and not admits(6, 5, 10)
    assert admits(0, 50, 10), "heavier than the limit: admitted into an empty window"
    assert not admits(1, 50, 10)
    assert admits(9, 0, 10) and not admits(10, 0, 10), "a report-only job waits while the window is full"


def test_the_memory_store_admits_all_or_none_and_says_how_long_to_wait():
    store = MemoryBudgets()
    a, b = Take("a", 10, 60, 6), Take("b", 10, 60, 6)
    assert store.take([a, b]) == [0, 0]
    waits = store.take([Take("a", 10, 60, 1), Take("b", 10, 60, 6)])
    assert waits[0] == 0 and 59 < waits[1] <= 60, "b refuses and says when its oldest weight leaves"
    assert store.take([Take("a", 10, 60, 4)]) == [0], "a's refused part was not recorded"
    store.spend(Take("a", 10, 60, 5))
    assert store.take([Take("a", 10, 60, 0)])[0] > 0, "spent after the fact: the next job waits"


def test_the_environment_overrides_a_budgets_limit_and_window_by_name():
    from conveyor.app import App
    from conveyor.errors import ConfigurationError
    from conveyor.settings import Settings

    jobs = Jobs()
    llm = Queue("llm", budgets=[Budget("provider-requests", limit=500)])

    @jobs.job("call", queue=llm, payload=Call, budgets=[Budget("provider-tokens", limit=90_000, weight="max_tokens")])
    def call(payload: Call, ctx) -> None: ...

    settings = Settings(broker="inline", budgets={"PROVIDER_TOKENS": {"limit": 1000, "per": 30}})
    app = App(settings, jobs=[jobs])
    (requests, tokens) = app.job_types["call"].all_budgets(app.queues["llm"])
    assert (requests.limit, requests.per) == (500, 60)
    assert (tokens.limit, tokens.per, tokens.weight) == (1000, 30, "max_tokens")
    with pytest.raises(ConfigurationError, match="unknown budget"):
        App(Settings(broker="inline", budgets={"nope": {"limit": 1}}), jobs=[jobs])
