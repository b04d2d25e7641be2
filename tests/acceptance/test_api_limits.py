"""The real ``conveyor api`` under hostile requests: 100 MiB JSON bodies cost it next to nothing and stall
no one; sign-in trusts ``X-Forwarded-For`` only from ``CONVEYOR_TRUSTED_PROXIES``.

The API runs as a subprocess, as users run it; its resident memory is sampled with psutil while the
floods are sent over raw sockets (with a declared length and chunked, anonymous and with a user's key),
and ``GET /metrics`` is asked all the while. Measured on the code before the bounded parser (the three
floods one after another): 88 -> 5,205 MiB and ``/metrics`` unanswered for 30 s; after: +1 MiB and
0.03 s. The test asserts a generous bound, not the figures.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from conveyor import access
from conveyor.app import App
from conveyor.settings import Settings
from tests.support.api_process import conveyor_api
from tests.support.obs_support import TOKEN

MiB = 1024 * 1024
#: The flood: a JSON array of 100 MiB of empty objects (json.loads makes ~35 million dicts of it).
FLOOD = b"[" + b"{}," * (100 * MiB // 3 - 1) + b"{}]"
#: Growth of the API's resident memory the flood may cause (before the fix: ~2.7 GiB).
MAX_GROWTH = 200 * MiB
#: Longest wait of a GET /metrics sent while the flood arrives (before: 5 s); generous for 2 shared cores.
MAX_METRICS_SECONDS = 3.0
UPLOAD_PATH = "/api/agents/upload-and-deploy"


def _flood(port: int, headers: dict[str, str], chunked: bool) -> bytes:
    """Send FLOOD to the upload route over a raw socket, 1 MiB at a time; the answer's first bytes."""
    head = [f"POST {UPLOAD_PATH} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(FLOOD)}")
    body = memoryview(FLOOD)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            for start in range(0, len(body), MiB):
                data = body[start : start + MiB]
                if chunked:
                    sock.sendall(f"{len(data):x}\r\n".encode())
                sock.sendall(data)
                if chunked:
                    sock.sendall(b"\r\n")
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the API answered and closed before taking it all: what it should do
        try:
            return sock.recv(4096)
        except OSError:
            return b""


def _watch(process: psutil.Process, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], process.memory_info().rss)
        except psutil.Error:
            return
        time.sleep(0.02)


def _metrics_latencies(base: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                answered = client.get("/metrics").status_code == 200
            except httpx.TimeoutException:
                answered = False  # counted as the whole wait (before the bounded parser: this)
            latencies.append(time.monotonic() - started if answered else float("inf"))
            time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_100_mib_json_body_costs_the_api_little_and_stalls_no_one(clean_env, tmp_path, database_url, redis_url):
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url))
    try:
        with app.pool.connection() as conn:
            access.create_user(conn, "mallory")
            _, key = access.create_api_key(conn, "mallory")
    finally:
        app.close()
    with conveyor_api(clean_env, tmp_path, database_url, redis_url) as (base, process):
        port = int(base.rsplit(":", 1)[1])
        with httpx.Client(base_url=base, timeout=30) as client:  # warm: the routes, the pool, a key lookup
            assert client.get("/api/builds/b1", headers={"Authorization": f"Bearer {key}"}).status_code == 404
        baseline = process.memory_info().rss
        peak, latencies, stop = [baseline], [], threading.Event()
        watchers = [
            threading.Thread(target=_watch, args=(process, stop, peak)),
            threading.Thread(target=_metrics_latencies, args=(base, stop, latencies)),
        ]
        for thread in watchers:
            thread.start()
        try:
            floods = {  # all at once, as a few such requests together exhausted the host
                "anonymous, declared": ({}, False),
                "anonymous, chunked": ({}, True),
                "a user's key, chunked": ({"Authorization": f"Bearer {key}"}, True),
            }
            with ThreadPoolExecutor(len(floods)) as pool:
                sent = {what: pool.submit(_flood, port, *how) for what, how in floods.items()}
                answers = {what: future.result() for what, future in sent.items()}
            time.sleep(0.5)  # a last sample after the answers
        finally:
            stop.set()
            for thread in watchers:
                thread.join(60)
        growth = peak[0] - baseline
        statuses = {what: answer.split(b" ")[1].decode() if answer else "reset" for what, answer in answers.items()}
        print(
            f"API RSS: baseline {baseline / MiB:.0f} MiB, peak {peak[0] / MiB:.0f} MiB, growth {growth / MiB:.0f} MiB;"
            f" slowest of {len(latencies)} GET /metrics {max(latencies):.2f} s; answers {statuses}"
        )
        assert growth < MAX_GROWTH, f"the API grew by {growth / MiB:.0f} MiB"
        assert latencies and max(latencies) < MAX_METRICS_SECONDS, latencies
        # Refused: too large as declared, no credentials before a byte of it is read, too large once 1 MiB is in
        # (an answer may be lost to the connection's reset under a body still arriving: "reset").
        expected = {"anonymous, declared": "413", "anonymous, chunked": "401", "a user's key, chunked": "413"}
        assert all(statuses[what] in (status, "reset") for what, status in expected.items()), statuses


def _sign_in(client: httpx.Client, token: str, claimed: str) -> int:
    form = {"token": token, "next": "/admin/queues"}
    return client.post("/admin/login", data=form, headers={"X-Forwarded-For": claimed}).status_code


def test_sign_in_believes_forwarded_for_only_from_trusted_proxies_and_never_refuses_the_right_token(
    clean_env, tmp_path, database_url, redis_url
):
    # No proxy trusted (the default): a claimed address is ignored, every guess counts against the peer.
    with conveyor_api(clean_env, tmp_path, database_url, redis_url) as (base, _):
        with httpx.Client(base_url=base, timeout=30) as client:
            assert [_sign_in(client, "wrong-guess-000", f"10.0.0.{n}") for n in range(1, 6)] == [401] * 5
            assert _sign_in(client, "wrong-guess-000", "10.9.9.9") == 429  # a fresh claim is no way around
            assert _sign_in(client, TOKEN, "10.0.0.1") == 303  # the right token is never locked out
            assert _sign_in(client, TOKEN, "127.0.0.1") == 303
    # The proxy on loopback trusted: its forwarded address is the client; one client's guesses are its own.
    with conveyor_api(clean_env, tmp_path, database_url, redis_url, CONVEYOR_TRUSTED_PROXIES="127.0.0.1") as (base, _):
        with httpx.Client(base_url=base, timeout=30) as client:
            assert [_sign_in(client, "wrong-guess-000", "10.1.0.1") for _ in range(5)] == [401] * 5
            assert _sign_in(client, "wrong-guess-000", "10.1.0.1") == 429
            assert _sign_in(client, "wrong-guess-000", "10.1.0.2") == 401
            assert _sign_in(client, TOKEN, "10.1.0.1") == 303
