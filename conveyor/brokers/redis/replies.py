"""Redis replies as text.

conveyor's Redis clients keep ``decode_responses`` off, so keys, fields and
ids come back as bytes; redis-py types them ``bytes | str`` (a decoding
client's replies too), and a script's reply may hold numbers. This is the
one place that turns a reply into ``str``.
"""

from __future__ import annotations


def text(value: object) -> str:
    """A reply as text: bytes decoded (UTF-8), anything else as ``str()`` gives it."""
    return value.decode() if isinstance(value, bytes) else str(value)
