"""The Redis broker's shape (issue 19.6): every Redis command it sends is in ``brokers/redis/jobs.py``.

As on Postgres, where ``postgres/jobs.py`` runs every statement of ``jobs.sql``,
the broker module is Dramatiq's adapter and the consumer uses the broker's
contract: neither sends a Redis command, builds a pipeline or calls the
script. ``sending.py`` and ``cluster.py`` are the send plumbing ``jobs.py``
calls (one connection per enqueue, a slot's node). No server: the source is read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import conveyor

REDIS = Path(conveyor.__file__).parent / "brokers" / "redis"

#: The module that sends the broker's commands, and the plumbing it sends them with.
MAY_SEND = {"jobs.py", "sending.py", "cluster.py"}

#: Calls that are Redis commands whatever object they are made on.
REDIS_CALLS = {"pipeline", "register_script", "pubsub", "execute_command", "eval", "evalsha", "script_load"}


def _redis_commands(tree: ast.AST) -> list[str]:
    """Redis commands sent in ``tree``: ``….client.cmd(…)`` or ``client.cmd(…)``, a pipeline, a script or a
    pub/sub subscription, and the script's commands sent through another object (``….jobs.call(…)``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner, name = node.func.value, node.func.attr
        on_client = (isinstance(owner, ast.Name) and owner.id == "client") or (
            isinstance(owner, ast.Attribute) and owner.attr == "client"
        )
        through_jobs = isinstance(owner, ast.Attribute) and owner.attr == "jobs" and name in ("call", "script")
        if on_client or name in REDIS_CALLS or through_jobs:
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node.func)}"))
    return [text for _, text in sorted(found)]


def test_every_redis_command_of_the_broker_is_sent_from_jobs_py():
    found = {}
    for path in sorted(REDIS.glob("*.py")):
        if path.name in MAY_SEND:
            continue
        uses = _redis_commands(ast.parse(path.read_text(), str(path)))
        if uses:
            found[path.name] = uses
    assert found == {}, "send Redis commands from brokers/redis/jobs.py (the broker and consumer call its methods)"


def test_only_jobs_py_reads_the_script():
    readers = sorted(p.name for p in REDIS.glob("*.py") if '"jobs.lua"' in p.read_text())
    assert readers == ["jobs.py"]


def test_the_command_scan_sees_a_broker_reading_keys_and_calling_the_script():
    source = (
        "class B:\n"
        "    def counts(self, q):\n"
        "        with self.client.pipeline(transaction=False) as pipe:\n"
        "            pipe.zcard(q)\n"
        "        self.client.smembers(q)\n"
        "        self.broker.client.blpop([q], timeout=1)\n"
        "        self.jobs.call('fetch', q)\n"
        "        self.jobs.counts(q)\n"
    )
    assert _redis_commands(ast.parse(source)) == [
        "3: self.client.pipeline",
        "5: self.client.smembers",
        "6: self.broker.client.blpop",
        "7: self.jobs.call",
    ]
