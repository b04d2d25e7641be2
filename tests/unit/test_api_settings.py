"""The API's input and proxy settings refuse what cannot work, at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conveyor.settings import Settings


def test_trusted_proxies_are_addresses_or_networks():
    assert Settings().trusted_proxies == ""  # nobody's X-Forwarded-For, by default
    assert Settings(trusted_proxies=" 10.0.0.1, 192.168.0.0/16 ,::1").trusted_proxies == "10.0.0.1,192.168.0.0/16,::1"
    for bad in ("*", "proxy.example", "10.0.0.1/99"):
        with pytest.raises(ValidationError, match="each entry is an IP address or network"):
            Settings(trusted_proxies=bad)


def test_a_json_body_may_hold_a_whole_payload():
    assert Settings().api_max_json_bytes == 1024 * 1024 >= Settings().max_payload_bytes
    with pytest.raises(ValidationError, match="at least CONVEYOR_MAX_PAYLOAD_BYTES"):
        Settings(api_max_json_bytes=1000, max_payload_bytes=2000)
