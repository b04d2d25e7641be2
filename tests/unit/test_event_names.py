"""Event names and signal data (conveyor.events): what is refused, and that the refusal never quotes it."""

from __future__ import annotations

import math

import pytest

from conveyor.errors import EventError, InvalidEventName, PayloadTooLarge
from conveyor.events import TIMED_OUT, check_name, decode_resolution, encode_signal


@pytest.mark.parametrize("name", ["approval:run-7", "user:42:approval:run-7", "a", "build.done_1@host", "x" * 200])
def test_event_names_of_letters_digits_and_separators_are_accepted(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name", ["", ":leading", "x" * 201, "has space", "<script>", "new\nline", "caf\u00e9", None, 7, "a/b", "a*"]
)
def test_other_names_are_refused_without_being_quoted(name):
    with pytest.raises(InvalidEventName) as caught:
        check_name(name)
    if isinstance(name, str) and name:
        assert name not in str(caught.value)


def test_signal_data_round_trips_and_a_timeout_reads_as_none():
    assert decode_resolution(encode_signal({"ok": [1, "two"]}, 1000)) == (False, {"ok": [1, "two"]})
    assert decode_resolution(encode_signal(None, 1000)) == (False, None)
    assert decode_resolution(TIMED_OUT) == (True, None)


def test_data_that_is_not_json_or_too_large_is_refused():
    with pytest.raises(EventError):
        encode_signal(math.nan, 1000)
    with pytest.raises(EventError):
        encode_signal(object(), 1000)
    with pytest.raises(PayloadTooLarge):
        encode_signal("x" * 2000, 1000)
