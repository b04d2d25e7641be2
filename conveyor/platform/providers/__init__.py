"""Model providers: one interface (:class:`~conveyor.platform.providers.base.Provider`), one module per backend.

``local`` is deterministic and needs no network (the default; the demo and
the tests use it); ``openai`` speaks the OpenAI-compatible chat-completions
API over HTTP with streaming. ``CONVEYOR_PROVIDER`` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.appcache import per_app
from conveyor.platform.providers.base import ChatMessage, Completion, Generation, Provider, Usage

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.platform.settings import PlatformSettings

__all__ = ["ChatMessage", "Completion", "Generation", "Provider", "Usage", "provider_for"]


def build_provider(settings: PlatformSettings) -> Provider:
    """A new provider as ``settings`` configure it."""
    if settings.provider == "openai":
        from conveyor.platform.providers.openai import OpenAIProvider

        return OpenAIProvider.from_settings(settings)
    from conveyor.platform.providers.local import LocalProvider

    return LocalProvider(chunk_delay=settings.local_chunk_delay)


@per_app
def provider_for(app: "App") -> Provider:
    """The app's provider, built once per App (an HTTP provider keeps its connection pool)."""
    from conveyor.platform.settings import platform_settings

    return build_provider(platform_settings(app))
