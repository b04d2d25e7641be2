"""Redis Cluster: the URL, and key names that carry the queue as their hash tag only on a cluster.

On a plain Redis every key name is what earlier releases wrote (a running
Redis's data is never orphaned by an upgrade); on a cluster every key of a
queue — its delay and dead-letter queues', its job records and dedup keys —
hashes to the slot of the queue's name.
"""

from __future__ import annotations

import binascii

import pytest

from conveyor.brokers.redis.keys import Keys
from conveyor.errors import ConfigurationError
from conveyor.redis_client import parse_cluster_url


def _slot(key: str) -> int:
    """Redis Cluster's HASH_SLOT: CRC16 (XMODEM) of the hash tag, or of the whole key without one."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key.encode(), 0) % 16384


def _every_key(keys: Keys, queue: str) -> list[str]:
    return [
        keys.queue(queue),
        keys.queue(f"{queue}.DQ"),
        keys.messages(queue),
        keys.messages(f"{queue}.DQ"),
        keys.messages(f"{queue}.XQ"),
        keys.acks("worker-1", queue),
        keys.acks("worker-1", f"{queue}.DQ"),
        keys.heartbeats,
        keys.job("0b5c6a1e-id"),
        keys.index(queue, "waiting"),
        keys.totals(queue),
        keys.paused,
        keys.wake(queue),
        keys.wake(f"{queue}.DQ"),
        keys.level(queue, 9),
        keys.levels(queue),
        keys.ranks(queue),
        keys.group(queue, "user:42"),
        keys.group_ready(queue, "user:42"),
        keys.group_stamp(queue),
        keys.groups(queue),
        keys.running(queue),
        keys.group_weights(queue),
        keys.group_turn(queue),
        f"{keys.ns}:dedup:any-key",  # built in jobs.lua from the same namespace
        f"{keys.ns}:deleted:0b5c6a1e-id",
    ]


def test_plain_redis_key_names_are_unchanged_from_earlier_releases():
    keys = Keys("conveyor").scope("emails.DQ")
    assert keys.ns == "conveyor"
    assert keys.queue("emails") == "conveyor:emails"
    assert keys.messages("emails.DQ") == "conveyor:emails.DQ.msgs"
    assert keys.job("abc") == "conveyor:job:abc"
    assert keys.index("emails", "failed") == "conveyor:idx:emails:failed"
    assert keys.paused == "conveyor:paused"
    assert keys.heartbeats == "conveyor:__heartbeats__"
    assert keys.group("emails", "u1") == "conveyor:group:emails:u1"  # an earlier release's list: drained first
    assert keys.group_weights("emails") == "conveyor:gweights:emails"  # jobs.lua builds the same names
    assert keys.group_turn("emails") == "conveyor:gturn:emails"
    assert not any("{" in key for key in _every_key(keys, "emails"))


def test_on_a_cluster_every_key_of_a_queue_is_on_the_slot_of_its_name():
    keys = Keys("conveyor", cluster=True)
    for queue in ("emails", "default", "agent-runs", "a.b_c"):
        scoped = keys.scope(queue)
        assert scoped.ns == f"conveyor{{{queue}}}"
        assert keys.scope(f"{queue}.DQ") == scoped == scoped.scope(f"{queue}.XQ")
        assert {_slot(key) for key in _every_key(scoped, queue)} == {_slot(queue)}


def test_on_a_cluster_queues_spread_over_slots():
    keys = Keys("conveyor", cluster=True)
    slots = {_slot(keys.scope(f"q{i}").job("x")) for i in range(20)}
    assert len(slots) > 10


def test_keys_no_queue_owns_share_one_slot_on_a_cluster_and_keep_their_names_on_plain_redis():
    assert Keys("conveyor").shared == "conveyor"
    assert Keys("conveyor", cluster=True).shared == "{conveyor}"
    assert Keys("conveyor", cluster=True).scope("emails").shared == "{conveyor}"


def test_a_scope_refuses_another_queues_keys():
    with pytest.raises(ValueError):
        Keys("conveyor", cluster=True).scope("emails").scope("default")


def test_a_namespace_with_a_brace_is_refused_on_a_cluster():
    with pytest.raises(ConfigurationError):
        Keys("con{veyor}", cluster=True)
    assert Keys("con{veyor}").ns == "con{veyor}"  # a plain Redis has no hash tags


def test_cluster_url_nodes_and_password_are_read():
    found = parse_cluster_url("redis+cluster://:s3cret@10.0.0.1:7000,[::1]:7001")
    assert found.nodes == [("10.0.0.1", 7000), ("::1", 7001)]
    assert found.password == "s3cret"
    assert parse_cluster_url("redis+cluster://h:1/").nodes == [("h", 1)]


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://", "redis+cluster://h", "redis+cluster://h:port", "redis+cluster://:pw@h:1/notadb"],
)
def test_a_bad_cluster_url_is_a_configuration_error_that_does_not_echo_it(url):
    with pytest.raises(ConfigurationError) as caught:
        parse_cluster_url(url)
    assert "pw" not in str(caught.value) and "notadb" not in str(caught.value)
