"""A real local HTTP server speaking the OpenAI chat-completions streaming format, scripted per request.

Each request takes the next step of the script: ``("ok", text)`` streams
``text`` word by word then usage and ``[DONE]``; ``("429", retry_after)``
answers Too Many Requests; ``("drop", text)`` promises a longer body than it
sends and closes the connection mid-stream; ``("500", None)`` fails. A request
past the script's end gets ``("ok", reply)``. With ``delay``, each answer
comes that many seconds after its request, as a model thinks first;
``peak_in_flight`` is the most requests it held at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many clients connect at once (a worker's whole concurrency): the default backlog of 5 would drop SYNs.
    request_queue_size = 256


class ChatServer:
    def __init__(self, script: list[tuple[str, object]], *, delay: float = 0.0, reply: str = "fine") -> None:
        self.script = list(script)
        self.delay = delay
        self.reply = reply
        self.requests: list[dict] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner._lock:
                    owner.requests.append(
                        {
                            "path": self.path,
                            "body": body,
                            "at": time.monotonic(),
                            "authorization": self.headers.get("Authorization"),
                        }
                    )
                    step = owner.script.pop(0) if owner.script else ("ok", owner.reply)
                    owner.in_flight += 1
                    owner.peak_in_flight = max(owner.peak_in_flight, owner.in_flight)
                try:
                    if owner.delay:
                        owner._closing.wait(owner.delay)
                    self._answer(*step)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up (a cancelled run): nothing to answer
                finally:
                    with owner._lock:
                        owner.in_flight -= 1

            def _answer(self, kind, arg):
                if kind == "429":
                    self._plain(429, {"error": {"message": "slow down"}}, {"Retry-After": str(arg)})
                elif kind == "500":
                    self._plain(500, {"error": {"message": "upstream exploded"}})
                else:
                    self._stream(str(arg), drop=kind == "drop")

            def _plain(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {
                    "Content-Type": "application/json",
                    "Content-Length": str(len(data)),
                    **(headers or {}),
                }.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, text, drop):
                words = re.findall(r"\S+\s*", text)
                events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
                events += [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
                events.append(
                    {
                        "choices": [],
                        "usage": {"prompt_tokens": 7, "completion_tokens": len(words), "total_tokens": 7 + len(words)},
                    }
                )
                lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
                if drop:
                    lines = lines[: max(2, len(lines) // 2)]
                body = "".join(lines).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                # A dropped connection: more promised than sent, then the socket closes.
                self.send_header("Content-Length", str(len(body) + (1000 if drop else 0)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                if drop:
                    self.close_connection = True

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "ChatServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()  # a request still thinking answers now
        self.server.shutdown()
        self.server.server_close()
