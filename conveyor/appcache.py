"""One shared object per App (a provider, a stream buffer, limits), owned and closed by its App."""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar


class Closeable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closeable)


class ResourceOwner(Protocol):
    """What :func:`per_app` needs of an App: its one object under a key, built on first use."""

    def resource(self, key: object, build: Callable[[], T]) -> T: ...


A = TypeVar("A", bound=ResourceOwner)


def per_app(build: Callable[[A], T]) -> Callable[[A], T]:
    """Wrap ``build(app)`` so each App gets one object, built on first use; ``App.close()`` closes it."""

    def get(app: A) -> T:
        return app.resource(get, lambda: build(app))

    get.__doc__ = build.__doc__
    get.__name__ = build.__name__
    return get
