"""One script call that knows whether it was sent: for the enqueue, whose outcome must be exact.

redis-py, asked to run a command, may send it again after a timeout or a
broken connection (its ``Retry``), and reports only the last error: a
caller cannot tell "Redis never saw it" from "Redis ran it and the reply
was lost". :func:`call_once` sends a script call at most once, on a
connection it checked out and verified itself, and says which case a
failure was: :class:`NotSent` (the connection could not be opened or
failed its health check: nothing of the call left this process) or
:class:`MaybeSent` (it failed while or after the call was written: Redis
may have run it). A reply, error replies included, is an answer and is
returned or raised as redis-py gives it.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis
from redis.exceptions import NoScriptError

from conveyor.redis_client import UNAVAILABLE

#: Argument types hiredis packs byte for byte as redis-py's encoder does (not bool, which redis-py refuses,
#: nor float, which it writes with repr).
_PLAIN = (str, bytes, int)

#: hiredis's packer (hiredis 2.2.1 and later; None before: redis-py packs then).
_PACK = getattr(hiredis, "pack_command", None)


class SendFailed(Exception):
    """The call got no reply; ``cause`` is redis-py's error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class NotSent(SendFailed):
    """Nothing of the call was written to Redis: it cannot have run."""


class MaybeSent(SendFailed):
    """The call was (perhaps partly) written, then the connection failed or timed out: it may have run."""


def call_once(
    client: redis.Redis, script: Any, keys: list[Any], args: list[Any], *, replicas: tuple[int, int] | None = None
) -> Any:
    """Run ``script`` (a registered redis-py Script) once: its reply, or NotSent / MaybeSent, never a silent repeat.

    NOSCRIPT (Redis restarted, the script cache is empty) ran nothing: the
    script is loaded and the call sent again, on the same connection.
    ``replicas=(n, timeout_ms)``: then ``WAIT n timeout_ms`` on that connection;
    fewer replicas in time is MaybeSent (the primary has it, a failover may not).
    """
    pool = client.connection_pool
    reader: Any = client  # redis-py's connection-level calls are unannotated
    try:
        conn: Any = pool.get_connection()  # opened and checked here: nothing of the call is written yet
    except UNAVAILABLE as exc:
        raise NotSent(exc) from exc
    try:
        try:
            conn.check_health()  # a PING on an idle connection, before the call, not before its repeat
        except UNAVAILABLE as exc:
            conn.disconnect()
            raise NotSent(exc) from exc
        for _ in range(2):
            try:
                conn.send_packed_command(
                    packed(conn, ("EVALSHA", script.sha, len(keys), *keys, *args)), check_health=False
                )
                reply = reader.parse_response(conn, "EVALSHA")
                if replicas:
                    conn.send_command("WAIT", *replicas, check_health=False)
                    acked = int(reader.parse_response(conn, "WAIT"))
                    if acked < replicas[0]:
                        raise MaybeSent(redis.TimeoutError(f"WAIT: {acked} of {replicas[0]} replica(s) in time"))
                return reply
            except NoScriptError:
                script.sha = client.script_load(script.script)
            except redis.BusyLoadingError:  # a reply (LOADING), though redis-py makes it a ConnectionError
                raise
            except UNAVAILABLE as exc:
                conn.disconnect()  # a late reply must never be read as the next call's
                raise MaybeSent(exc) from exc
            except redis.ResponseError:
                raise
            except BaseException:
                conn.disconnect()
                raise
        raise redis.ResponseError("NOSCRIPT the script vanished again right after it was loaded")
    finally:
        pool.release(conn)


def packed(conn: Any, args: tuple[Any, ...]) -> Any:
    """``args`` as ``conn.send_command`` would pack them: straight to hiredis when every one is a str, bytes
    or int and the connection encodes text as strict UTF-8 (redis-py's default), about a fifth of the cost
    of redis-py's per-argument encoder for an enqueue's twenty-odd arguments; anything else, redis-py's own."""
    encoder = conn.encoder
    if (
        _PACK is not None
        and encoder.encoding == "utf-8"
        and encoder.encoding_errors == "strict"
        and " " not in args[0]
        and all(type(arg) in _PLAIN for arg in args)
    ):
        return [_PACK(args)]
    return conn.pack_command(*args)
