"""A TCP proxy that forwards every request and, on command, drops the replies: a lost reply, made real.

``ReplyDroppingProxy(port)`` listens on a free loopback port and forwards
each connection to ``127.0.0.1:port``. While :attr:`drop_replies` is set
(or :meth:`drop_next` has replies left to drop), what the server sends
back is read and thrown away: the server applied the request, the client
never hears so and times out. Threads and sockets only, no mock: the
client's own socket, timeouts and reconnects are the ones under test.
"""

from __future__ import annotations

import socket
import threading

from tests.support.servers import free_port


class ReplyDroppingProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.drop_replies = False
        self._drops_left = 0
        self._containing = b""
        #: Replies (server->client reads) thrown away so far.
        self.dropped = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name="reply-dropping-proxy", daemon=True)
        self._thread.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def drop_next(self, count: int, *, containing: bytes = b"") -> None:
        """Drop the next ``count`` replies (one read of the server's socket each), then forward again;
        with ``containing``, only replies holding those bytes count (Postgres's ``COMMIT`` completion)."""
        with self._lock:
            self._drops_left = count
            self._containing = containing

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _drop(self, data: bytes) -> bool:
        with self._lock:
            if self.drop_replies:
                self.dropped += 1
                return True
            if self._drops_left > 0 and self._containing in data:
                self._drops_left -= 1
                self.dropped += 1
                return True
            return False

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if replies and self._drop(data):
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ReplyDroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
