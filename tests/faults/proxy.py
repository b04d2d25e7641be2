"""A TCP proxy between the producer and a server that can lose the server's replies.

Requests always reach the server (it applies them); while :meth:`drop` is
in force, whatever the server answers is thrown away, and when the window
ends every connection that lost a reply is closed (the way a broken path
ends: the client learns nothing of what it sent, only that the connection
died). The client's own timeout or that reset is what it sees.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class ReplyDroppingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._dropping_until = 0.0
        #: Connections that lost a reply in the current window: closed when it ends.
        self._victims: set[socket.socket] = set()
        self.dropped_bytes = 0
        self._closed = False
        threading.Thread(target=self._accept, name="reply-proxy", daemon=True).start()

    def url_for(self, url: str) -> str:
        """``url`` with its host:port replaced by the proxy's."""
        host_port = f"{self.upstream[0]}:{self.upstream[1]}"
        if host_port not in url:
            raise ValueError("the URL does not name the proxied server")
        return url.replace(host_port, f"127.0.0.1:{self.port}")

    def drop(self, seconds: float) -> None:
        """Lose every reply for ``seconds`` (blocks), then reset the connections that lost one."""
        with self._lock:
            self._dropping_until = time.monotonic() + seconds
        time.sleep(seconds)
        with self._lock:
            self._dropping_until = 0.0
            victims, self._victims = self._victims, set()
        for client in victims:
            self._close_pair(client)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for client, server in pairs:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, reply: bool) -> None:
        client = dst if reply else src
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if reply:
                    with self._lock:
                        dropping = time.monotonic() < self._dropping_until
                        if dropping:
                            self._victims.add(client)
                            self.dropped_bytes += len(data)
                    if dropping:
                        continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close_pair(client)

    def _close_pair(self, client: socket.socket) -> None:
        with self._lock:
            pairs = [p for p in self._pairs if p[0] is client]
            self._pairs = [p for p in self._pairs if p[0] is not client]
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
