"""Checks of parsed JSON that untrusted input gets before anything else reads it.

Iterative, so a hostile document cannot exhaust the interpreter's stack
here; :func:`json.loads` itself raises RecursionError on a very deep one,
which callers turn into the same "too deep" answer.
"""

from __future__ import annotations

import re
from typing import Any


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def holds_nul(value: Any) -> bool:
    """Whether a parsed JSON value has a NUL in any string, key or value."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# -- the same checks on raw bytes, without parsing ------------------------------------
# Every pass below is one C-level scan (re, bytes methods): no Python loop per byte, no object per value,
# so a hostile body costs a few copies of itself and no more.

#: A JSON string literal (the unrolled form: no backtracking on long strings).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: ``\u0000`` that is an escape, not an escaped backslash followed by the text ``u0000``.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
#: An innermost container: a leaf of the bracket tree once everything but brackets is gone.
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")
#: Every byte but the brackets, deleted by bytes.translate.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def scan_json_bytes(body: bytes, max_depth: int, max_items: int) -> str | None:
    """What is wrong with a JSON body's bytes (a NUL, too deep, too many values), else None.

    Only these three are judged: malformed JSON passes, for the route to refuse. Whatever ``json.loads``
    accepts has the same strings as :data:`_STRING` finds scanning from the left, so the checks see
    exactly the structure the parse would build.
    """
    if b"\x00" in body or _NUL_ESCAPE.search(body):
        return "NUL characters are not allowed"
    structure = _STRING.sub(b'""', body)
    # Values: each container, plus one per comma (an item after the first); strings and numbers are items.
    items = structure.count(b"[") + structure.count(b"{") + structure.count(b",")
    if items > max_items:
        return f"holds more than {max_items} values"
    brackets = structure.translate(None, _NOT_BRACKETS)
    # Each pass removes the innermost containers; a body nested n deep empties in n passes.
    for _ in range(max_depth):
        if not brackets:
            return None
        brackets = _EMPTY_PAIR.sub(b"", brackets)
    # Left: containers deeper than the limit, or unbalanced brackets (malformed, but a run of openers
    # would still take the parser that deep before it failed).
    if _EMPTY_PAIR.search(brackets) or brackets.count(b"[") + brackets.count(b"{") > max_depth:
        return f"nested deeper than {max_depth} levels"
    return None
