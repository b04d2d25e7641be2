"""The enqueue's shortcuts say what Dramatiq's own calls say: the same bytes, the same hooks in the same order."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import dramatiq.message
import pytest
from dramatiq import Message, Middleware
from dramatiq.encoder import JSONEncoder, PickleEncoder
from dramatiq.middleware import SkipMessage

from conveyor.brokers.base import encode_message
from conveyor.brokers.inline import InlineBroker
from conveyor.middleware.base import ConveyorMiddleware


def test_encode_message_is_dramatiqs_encoding_byte_for_byte() -> None:
    assert [f.name for f in dataclasses.fields(Message)] == [
        "queue_name",
        "actor_name",
        "args",
        "kwargs",
        "options",
        "message_id",
        "message_timestamp",
    ], "Dramatiq's Message changed: encode_message must name every field"
    message = Message(
        queue_name="q",
        actor_name="a.b",
        args=({"text": 'héllo \u2603 \U0001f600 "q" \\ \x00', "n": 1.5e300, "big": 2**70, "none": None},),
        kwargs={"k": [1, 2]},
        options={"key": "k:1", "redis_message_id": "r", "eta": 12},
    )
    assert encode_message(message) == message.encode()


def test_encode_message_asks_any_other_encoder() -> None:
    message = Message(queue_name="q", actor_name="a", args=(1,), kwargs={}, options={})
    saved = dramatiq.message.global_encoder
    dramatiq.set_encoder(PickleEncoder())
    try:
        assert encode_message(message) == message.encode()
        assert encode_message(message)[:1] == b"\x80"  # pickled, not JSON
    finally:
        dramatiq.set_encoder(saved)
    assert type(dramatiq.message.global_encoder) is JSONEncoder


class Listens(Middleware):
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(f"before {self.name}")

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(f"after {self.name}")


class Fails(Middleware):
    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        raise RuntimeError("boom")


class Skips(Middleware):
    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        raise SkipMessage()


class Counts(ConveyorMiddleware):
    def after_enqueue_jobs(self, broker: Any, items: Any, refs: Any) -> None: ...


def test_hooks_are_those_that_listen_in_order_and_follow_the_middleware_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    broker = InlineBroker(middleware=[Listens(calls, "1"), Middleware(), Fails(), Listens(calls, "2")])
    assert [h.__self__.name for h in broker.hooks("before_enqueue") if isinstance(h.__self__, Listens)] == ["1", "2"]
    assert not any(type(h.__self__) is Middleware for h in broker.hooks("before_enqueue"))
    with caplog.at_level(logging.CRITICAL):
        broker.emit_before("enqueue", None, None)  # a failing hook is logged, the next still runs
        broker.emit_after("enqueue", None, None)
    assert calls == ["before 1", "before 2", "after 2", "after 1"]
    assert "Unexpected failure in before_enqueue" in caplog.text

    broker.add_middleware(Listens(calls, "3"))  # a later middleware is heard
    calls.clear()
    broker.emit_before("enqueue", None, None)
    assert calls == ["before 1", "before 2", "before 3"]

    broker.add_middleware(Skips())
    with pytest.raises(SkipMessage):  # a MiddlewareError stops the signal, as in Dramatiq
        broker.emit_before("enqueue", None, None)


def test_conveyor_hooks_leave_out_dramatiq_middleware_and_the_no_ops() -> None:
    counts = Counts()
    broker = InlineBroker(middleware=[Listens([], "x"), ConveyorMiddleware(), counts])
    assert [h.__self__ for h in broker.hooks("after_enqueue_jobs", ConveyorMiddleware)] == [counts]


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 1, "ns{q}", "enqueue", "", "host:1:ab", 86_400_000, 1, "q.DQ", b'{"a":"\\u00e9"}'),
        ("EVALSHA", "sha", 0, "é ☃ 😀", "", -1, 0, 2**70, b"\r\n$3\r\n", "key with spaces"),
        ("EVALSHA", "sha", 1, "k", 1.5, "float: redis-py's own"),
    ],
)
def test_packed_is_redis_pys_packing_byte_for_byte(args: tuple[Any, ...]) -> None:
    import redis

    from conveyor.brokers.redis.sending import packed

    conn = redis.Redis().connection_pool.make_connection()  # never connected: packing only
    assert [bytes(x) for x in packed(conn, args)] == [bytes(x) for x in conn.pack_command(*args)]


def test_packed_refuses_what_redis_py_refuses() -> None:
    import redis

    from conveyor.brokers.redis.sending import packed

    conn = redis.Redis().connection_pool.make_connection()
    with pytest.raises(redis.DataError):
        packed(conn, ("EVALSHA", "sha", 0, True))


def test_a_hook_is_looked_up_at_the_call_as_dramatiq_does() -> None:
    calls: list[str] = []

    class Later(Middleware):
        def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
            calls.append("class")

    broker = InlineBroker(middleware=[Later()])
    broker.emit_before("enqueue", None, None)
    Later.before_enqueue = lambda self, broker, message, delay: calls.append("patched")  # type: ignore[method-assign]
    broker.emit_before("enqueue", None, None)
    assert calls == ["class", "patched"]


def test_a_message_subclass_keeps_its_own_fields_on_the_wire() -> None:
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Tenanted(Message):  # type: ignore[type-arg]
        tenant: str = "acme"

    message = Tenanted(queue_name="q", actor_name="a", args=(), kwargs={}, options={})
    assert encode_message(message) == message.encode() and b'"tenant":"acme"' in encode_message(message)
