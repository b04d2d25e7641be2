"""``redis+sentinel://`` URLs: what is read from them, and a clear error (never the URL itself) for a bad one."""

from __future__ import annotations

import pytest

from conveyor.errors import ConfigurationError
from conveyor.redis_client import parse_sentinel_url


def test_hosts_service_db_and_password_are_read():
    found = parse_sentinel_url("redis+sentinel://:s3cret@10.0.0.1:26379,[::1]:26380/mymaster/2")
    assert found.sentinels == [("10.0.0.1", 26379), ("::1", 26380)]
    assert (found.service, found.db, found.password) == ("mymaster", 2, "s3cret")
    assert parse_sentinel_url("redis+sentinel://h:1/svc").db == 0


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://",
        "redis+sentinel://h:1",
        "redis+sentinel://h:1/",
        "redis+sentinel://h/svc",
        "redis+sentinel://h:port/svc",
        "redis+sentinel://:pw@h:1/svc/notadb",
    ],
)
def test_a_bad_url_is_a_configuration_error_that_does_not_echo_it(url):
    with pytest.raises(ConfigurationError) as caught:
        parse_sentinel_url(url)
    assert "pw" not in str(caught.value) and "notadb" not in str(caught.value)
