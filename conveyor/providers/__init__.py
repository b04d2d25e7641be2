"""Model providers: one interface (:class:`~conveyor.providers.base.Provider`), one module per backend.

``local`` is deterministic and needs no network (the default; the demo and
the tests use it); ``openai`` speaks the OpenAI-compatible chat-completions
API over HTTP with streaming. ``CONVEYOR_PROVIDER`` picks one.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from .base import ChatMessage, Completion, Generation, Provider, Usage

if TYPE_CHECKING:
    from ..app import App

__all__ = ["ChatMessage", "Completion", "Generation", "Provider", "Usage", "provider_for"]

_providers: "weakref.WeakKeyDictionary[App, Provider]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def build_provider(settings) -> Provider:
    """A new provider as ``settings`` configure it."""
    if settings.provider == "openai":
        from .openai import OpenAIProvider

        return OpenAIProvider.from_settings(settings)
    from .local import LocalProvider

    return LocalProvider(chunk_delay=settings.local_chunk_delay)


def provider_for(app: "App") -> Provider:
    """The app's provider, built once per App (an HTTP provider keeps its connection pool)."""
    with _lock:
        provider = _providers.get(app)
        if provider is None:
            provider = _providers[app] = build_provider(app.settings)
            weakref.finalize(app, provider.close)  # the HTTP pool goes with its App
        return provider
