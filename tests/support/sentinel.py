"""A private Redis Sentinel group: a primary, a replica and three sentinels, as local processes on free ports.

Everything runs in temp dirs on loopback (tests/support/servers.py's helpers)
and is stopped and removed by :meth:`SentinelGroup.close`, whatever was
started. The service is called ``mymaster``.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time

import redis

from tests.support.servers import RedisServer, ServerStartError, _Server

SERVICE = "mymaster"


class SentinelServer(_Server):
    """One ``redis-server --sentinel`` watching ``primary_port``."""

    name = "sentinel"

    def __init__(self, primary_port: int, tmpdir: str | None = None) -> None:
        super().__init__(tmpdir or tempfile.mkdtemp(prefix="conveyor-sentinel-"))
        self.primary_port = primary_port
        self.executable = shutil.which("redis-server") or "/usr/bin/redis-server"
        try:
            self._start_first_time()
        except BaseException:
            self.close()
            raise

    def _spawn_and_wait(self) -> None:
        config = self.tmpdir / "sentinel.conf"  # a sentinel rewrites its config: it must be a file of its own
        config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {self.tmpdir}",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2",
                    f"sentinel down-after-milliseconds {SERVICE} 1000",
                    f"sentinel failover-timeout {SERVICE} 10000",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    "",
                ]
            )
        )
        self._proc = self._popen([self.executable, str(config), "--sentinel"])
        self._wait_until(self._pings, "answering PING")

    def _pings(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)


class SentinelGroup:
    """A primary, one replica of it, three sentinels; ``url`` is conveyor's ``redis+sentinel://`` URL."""

    def __init__(self) -> None:
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        try:
            primary = RedisServer(tempfile.mkdtemp(prefix="conveyor-sentinel-primary-"))
            self.servers.append(primary)
            replica = RedisServer(tempfile.mkdtemp(prefix="conveyor-sentinel-replica-"))
            self.servers.append(replica)
            with redis.Redis(host="127.0.0.1", port=replica.port, socket_timeout=5) as r:
                r.execute_command("REPLICAOF", "127.0.0.1", primary.port)
            for _ in range(3):
                self.sentinels.append(SentinelServer(primary.port))
            self._wait(lambda: self._replica_known() and self._sentinels_known(), "sentinels to see the replica")
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def primary_port(self) -> int:
        with self.sentinels[0].client() as c:
            return int(c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])

    def failover(self) -> int:
        """``SENTINEL FAILOVER``; returns once every sentinel names the new primary and it has a replica again."""
        before = self.primary_port()
        with self.sentinels[0].client() as c:
            c.execute_command("SENTINEL", "FAILOVER", SERVICE)

        def moved() -> bool:
            ports = set()
            for s in self.sentinels:
                with s.client() as c:
                    ports.add(int(c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1]))
            return ports != {before} and len(ports) == 1

        self._wait(moved, "the failover")
        return self.primary_port()

    def _replica_known(self) -> bool:
        with self.sentinels[0].client() as c:
            return bool(c.execute_command("SENTINEL", "REPLICAS", SERVICE))

    def _sentinels_known(self) -> bool:
        for s in self.sentinels:
            with s.client() as c:
                if len(c.execute_command("SENTINEL", "SENTINELS", SERVICE)) < len(self.sentinels) - 1:
                    return False
        return True

    @staticmethod
    def _wait(ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise ServerStartError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def close(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.close()
