"""Asynchronous interrupts (a job's time limit) that never land inside a pool's checkout or return.

Dramatiq's time limit raises an exception in the job's thread from another
thread (``PyThreadState_SetAsyncExc``): it fires at the next bytecode the
thread runs, wherever that is. Inside a connection pool's checkout, after
the connection left the pool and before the caller holds it, or inside its
return, it leaks the connection; a long-lived worker slowly loses its pool.

Here an interrupt is deferred while its thread is *shielded*: :func:`interrupt`
(the time limit's manager calls it) raises at once in an unshielded thread,
and only notes it for a shielded one; leaving the shield raises what was
noted, at a point the caller chose. Entering a shield takes back an
interrupt that was set but not yet delivered (``SetAsyncExc(thread, NULL)``),
under the same lock :func:`interrupt` decides under, so none can arrive inside.
:func:`pooled` is the checkout and return every conveyor pool runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dramatiq.threading import Interrupt, raise_thread_exception

T = TypeVar("T")

_lock = threading.Lock()
#: Thread id -> how deep in shields it is.
_depth: dict[int, int] = {}
#: Thread id -> an interrupt noted while it was shielded, raised when it leaves the last shield.
_deferred: dict[int, type[BaseException]] = {}
#: Thread id -> an interrupt set in it asynchronously, perhaps not delivered yet.
_flagged: dict[int, type[BaseException]] = {}


def interrupt(thread_id: int, exception: type[BaseException]) -> None:
    """Raise ``exception`` in the thread now, or when it leaves its shield (see the module docstring)."""
    with _lock:
        if _depth.get(thread_id, 0) > 0:
            _deferred[thread_id] = exception
            return
        _flagged[thread_id] = exception
        raise_thread_exception(thread_id, exception)  # type: ignore[no-untyped-call]


def _enter() -> None:
    ident = threading.get_ident()
    with _lock:
        flagged = _flagged.pop(ident, None)
        if flagged is not None:
            # Set, maybe not delivered yet: take it back and defer it (a no-op if it was delivered).
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
            _deferred[ident] = flagged
        _depth[ident] = _depth.get(ident, 0) + 1


def _exit() -> type[BaseException] | None:
    """Leave one shield; the interrupt deferred while shielded, once the last one is left."""
    ident = threading.get_ident()
    with _lock:
        depth = _depth.get(ident, 0) - 1
        if depth > 0:
            _depth[ident] = depth
            return None
        _depth.pop(ident, None)
        return _deferred.pop(ident, None)


def enter_shield() -> None:
    """Shield the calling thread: an interrupt set on it and not yet delivered is taken back and deferred,
    and one asked for while shielded is only noted (:func:`leave_shield` returns it)."""
    _enter()


def leave_shield() -> type[BaseException] | None:
    """Leave the shield :func:`enter_shield` put up; the interrupt noted meanwhile, for the caller to act on."""
    return _exit()


def reset() -> None:
    """Forget the calling thread's shields and interrupts (a job's start and end): none outlives its job."""
    ident = threading.get_ident()
    with _lock:
        _depth.pop(ident, None)
        _deferred.pop(ident, None)
        if _flagged.pop(ident, None) is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


@contextlib.contextmanager
def pooled(get: Callable[[], T], put: Callable[[T], Any]) -> Iterator[T]:
    """``get()`` a pooled resource, yield it, ``put(it)`` back; an interrupt lands in neither call.

    An interrupt that arrives during the checkout is raised once the caller
    holds the resource (inside the ``try`` whose ``finally`` returns it); one
    that arrives at the start of the return is caught, the return completes,
    and it is raised after.
    """
    _enter()  # an interrupt delivered in here is raised before anything is taken
    try:
        resource = get()
    except BaseException:
        _exit()
        raise
    try:
        deferred = _exit()
        if deferred is not None:
            raise deferred()
        yield resource
    finally:
        returned = [False]
        late: BaseException | None = None
        after: type[BaseException] | None = None
        while not returned[0]:
            try:
                after = _put_shielded(put, resource, returned)
            except Interrupt as exc:  # delivered outside the shield: the return still completes, then it is raised
                late = exc
        if late is not None:
            raise late
        if after is not None:
            raise after()


def _put_shielded(put: Callable[[T], Any], resource: T, returned: list[bool]) -> type[BaseException] | None:
    """``put(resource)`` shielded; ``returned[0]`` is set while still shielded, so it is never put twice."""
    _enter()
    try:
        put(resource)
        returned[0] = True
    finally:
        deferred = _exit()
    return deferred


class JobCancelled(Interrupt):
    """Raised in a running job's thread when its cancellation was asked and it did not stop within the grace
    (``CONVEYOR_CANCEL_GRACE_SECONDS``). A ``BaseException`` (Dramatiq's ``Interrupt``): ``except Exception``
    in the job does not swallow it; the job ends ``cancelled``, never failed or retried."""
