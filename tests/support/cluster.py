"""A private Redis Cluster: three primaries (and optionally a replica each) as local processes on free ports.

Each node is a ``redis-server --cluster-enabled yes`` in its own temp dir on
loopback; ``redis-cli --cluster create`` splits the 16384 slots over them.
:meth:`RedisCluster.close` stops every node and removes its dir, whatever was
started. ``url`` is conveyor's ``redis+cluster://host:port,…``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import redis

from tests.support.servers import RedisServer, ServerStartError, free_port

#: Seconds the nodes get to agree on the slots after ``--cluster create``.
READY_TIMEOUT = 60.0


class ClusterNode(RedisServer):
    """One cluster-enabled redis-server (appendonly, ``appendfsync always``: production's settings)."""

    name = "redis-cluster-node"

    def __init__(self) -> None:
        super().__init__(tempfile.mkdtemp(prefix="conveyor-redis-cluster-"), durable=True)

    def _spawn_and_wait(self) -> None:
        if not getattr(self, "bus_port", 0):
            self.bus_port = free_port()
        self._proc = self._popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                # The bus port defaults to port + 10000, past 65535 for a high free port: pick one too.
                "--cluster-port",
                str(self.bus_port),
                "--cluster-config-file",
                str(self.tmpdir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.tmpdir),
                "--daemonize",
                "no",
                "--logfile",
                "",
            ]
        )
        self._wait_until(self._pings, "answering PING")


class RedisCluster:
    """Three primaries holding all slots; ``flush()`` empties every node (a test's clean state)."""

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        self.nodes: list[ClusterNode] = []
        try:
            for _ in range(primaries * (1 + replicas)):
                self.nodes.append(ClusterNode())
            cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            done = subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{n.port}" for n in self.nodes),
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ],
                capture_output=True,
                timeout=READY_TIMEOUT,
                check=False,
            )
            if done.returncode != 0:
                raise ServerStartError(f"redis-cli --cluster create failed: {done.stdout[-500:]!r}")
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def _node_clients(self) -> list[redis.Redis]:
        return [redis.Redis(host="127.0.0.1", port=n.port, socket_timeout=5) for n in self.nodes if n.is_running]

    def owner(self, key: str) -> ClusterNode:
        """The running primary that serves ``key``'s slot now."""
        for node in self.nodes:
            if not node.is_running:
                continue
            with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5) as c:
                slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
                for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(primary[1])
                        return next(n for n in self.nodes if n.port == port)
        raise ServerStartError("no running node answers CLUSTER SLOTS")

    def wait_ready(self) -> None:
        """Until every running node says the cluster is ok and serves all slots, and every replica is linked
        to its primary and synced (after a failover, say: a replica still syncing cannot be promoted, so a
        primary killed meanwhile would have no failover)."""
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            ready = []
            for c in self._node_clients():
                with c:
                    state = c.execute_command("CLUSTER", "INFO").decode()
                    replication = c.info("replication")
                ok = "cluster_state:ok" in state and "cluster_slots_assigned:16384" in state
                linked = replication.get("role") != "slave" or (
                    replication.get("master_link_status") == "up" and not replication.get("master_sync_in_progress")
                )
                ready.append(ok and linked)
            if all(ready):
                return
            if time.monotonic() > deadline:
                raise ServerStartError("timed out waiting for the cluster to be ok on every node")
            time.sleep(0.1)

    def flush(self) -> None:
        """FLUSHALL on every primary (a replica follows its primary)."""
        for c in self._node_clients():
            with c:
                if c.execute_command("ROLE")[0] == b"master":
                    c.flushall()

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
