"""The error tree and its one HTTP translation (conveyor.api.errors); no servers."""

from __future__ import annotations

import pytest

from conveyor import errors as e
from conveyor.api.errors import STATUS, detail_for, status_for
from conveyor.platform import errors as platform_errors


def test_every_unavailable_store_is_one_store_unavailable():
    assert issubclass(e.BrokerUnavailable, e.StoreUnavailable)
    assert issubclass(e.DatabaseUnavailable, e.StoreUnavailable)
    assert issubclass(e.BrokerUnavailable, e.EnqueueError)  # nothing was enqueued: still an enqueue error
    assert issubclass(e.BrokerUnreachable, e.StoreUnavailable)  # a read or operator call: the server is away too
    assert issubclass(e.BrokerUnreachable, e.BrokerError)


def test_every_refusal_is_one_store_refused():
    assert issubclass(e.DatabaseRefused, e.StoreRefused)
    assert issubclass(e.BrokerRejected, e.StoreRefused)
    assert not issubclass(e.StoreRefused, e.StoreUnavailable)


def test_retry_later_is_no_failure_but_a_rate_limited_provider_is_a_provider_error():
    assert not issubclass(e.RetryLater, e.JobError)
    assert issubclass(platform_errors.ProviderRateLimited, e.RetryLater)
    assert issubclass(platform_errors.ProviderRateLimited, platform_errors.ProviderError)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (e.BrokerUnavailable("down"), 503),
        (e.DatabaseUnavailable("down"), 503),
        (e.BrokerUnreachable("down"), 503),
        (e.EnqueueOutcomeUnknown("broke"), 503),
        (e.DatabaseRefused("no"), 500),
        (e.BrokerRejected("no"), 500),
        (platform_errors.UploadRefused("bad"), 422),
        (platform_errors.UploadTooLarge("big"), 413),
        (platform_errors.QuotaExceeded("runs"), 429),
        (platform_errors.ProviderRejected("no"), 500),
        (e.UnknownJob("x", []), 422),
        (e.InvalidPayload("x", []), 422),
        (e.PayloadTooLarge("big"), 413),
        (e.SecretKeyError("no key"), 503),
        (e.UnknownQueue("q"), 404),
        (e.JobNotFound("j"), 404),
        (e.JobStateConflict("j"), 409),
        (e.AdminError("a"), 400),
        (e.InvalidQuery("cursor"), 400),
        (e.RecordNotFound("r"), 404),
        (e.RecordConflict("r"), 409),
        (e.ScheduleNotFound("s"), 404),
        (e.InvalidSchedule("s"), 422),
        (e.ConveyorError("?"), 500),
    ],
)
def test_status_of_each_error(error, status):
    assert status_for(error) == status


def test_every_error_class_has_a_status_through_its_parents():
    classes = [c for c in vars(e).values() if isinstance(c, type) and issubclass(c, e.ConveyorError)]
    assert all(any(k in STATUS for k in c.__mro__) for c in classes)


def test_the_platforms_errors_live_in_its_package_under_the_librarys_bases():
    """The library's tree names no platform error; each of the platform's has a library base (and so a status)."""
    moved = [c for c in vars(platform_errors).values() if isinstance(c, type) and issubclass(c, e.ConveyorError)]
    own = [c for c in moved if c.__module__ == platform_errors.__name__]
    assert len(own) >= 12 and not any(hasattr(e, c.__name__) for c in own)
    assert all(any(k.__module__ == e.__name__ for k in c.__mro__) for c in own)


@pytest.mark.parametrize(
    "error",
    [
        e.DatabaseUnavailable('Postgres is unavailable: connection to server at "10.1.2.3", port 5432 failed'),
        e.BrokerUnreachable("Redis is unavailable: Error 111 connecting to 10.1.2.3:6379"),
        e.BrokerUnavailable("cannot reach Redis at 10.1.2.3:6379"),
        e.EnqueueOutcomeUnknown('Postgres is unavailable (the enqueue): connection to server at "10.1.2.3" failed'),
    ],
)
def test_a_503_names_what_is_away_never_the_drivers_line_with_its_address(error):
    from conveyor.api.errors import detail_for

    detail = detail_for(error)
    assert "10.1.2.3" not in detail and "port" not in detail, detail
    assert "unavailable" in detail or "same key" in detail


def test_an_unknown_job_state_is_an_invalid_query_answered_400_without_the_state():
    from conveyor.brokers.base import check_state

    check_state("failed")
    with pytest.raises(e.InvalidQuery) as refused:
        check_state("zq9mark")
    assert status_for(refused.value) == 400 and "zq9mark" not in detail_for(refused.value)


def test_an_admin_not_found_names_the_kind_never_the_id_asked_for():
    from conveyor.api.errors import detail_for

    assert detail_for(e.JobNotFound("no job 'job-asked-for'")) == "no such job"
    detail = detail_for(e.UnknownQueue("no queue 'asked-for'; queues: agent, critical", "agent, critical"))
    assert detail == "no such queue; queues: agent, critical"
