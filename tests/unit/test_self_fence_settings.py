"""The self-fence's settings check: a worker must exit well before recovery can hand its jobs out."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conveyor.settings import Settings


def test_the_defaults_leave_the_lease_a_margin_beyond_the_exit():
    for settings in (Settings(database_url="postgresql://h/db"), Settings(redis_url="redis://h")):
        lease = settings.worker_lease
        assert settings.self_fence_threshold + settings.self_fence_interval + settings.self_fence_margin <= lease


def test_an_exit_too_close_to_the_lease_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="self_fence_fraction"):
        Settings(database_url="postgresql://h/db", pg_lease_seconds=15, self_fence_fraction=0.95)
    with pytest.raises(ValidationError, match="self_fence_fraction"):
        Settings(redis_url="redis://h", heartbeat_timeout=10, self_fence_fraction=0.9)


def test_an_exit_sooner_than_the_heartbeat_cadence_allows_is_refused():
    # Redis heartbeats with each recovery pass: 1.2 s of silence is one missed pass, not a lost server.
    with pytest.raises(ValidationError, match="self_fence_fraction"):
        Settings(redis_url="redis://h", heartbeat_timeout=2, maintenance_interval=1)
    with pytest.raises(ValidationError, match="self_fence_fraction"):
        Settings(database_url="postgresql://h/db", self_fence_fraction=0.2)  # beats every sixth of the lease


def test_the_inline_broker_has_no_lease_to_check():
    Settings(broker="inline", self_fence_fraction=0.99)
