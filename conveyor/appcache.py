"""One shared object per App (a provider, a stream buffer, limits), closed when its App goes."""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Protocol, TypeVar


class Closeable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closeable)


def per_app(build: Callable[..., T]) -> Callable[..., T]:
    """Wrap ``build(app)`` so each App gets one object, built on first use and closed with the App."""
    made: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def get(app) -> T:
        with lock:
            obj = made.get(app)
            if obj is None:
                obj = made[app] = build(app)
                weakref.finalize(app, obj.close)  # its connections go with its App
            return obj

    get.__doc__ = build.__doc__
    get.__name__ = build.__name__
    return get
