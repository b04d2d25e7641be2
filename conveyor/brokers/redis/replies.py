"""Redis replies as text: :func:`conveyor.redis_client.text`, under the name the broker's modules import."""

from __future__ import annotations

from conveyor.redis_client import text

__all__ = ["text"]
