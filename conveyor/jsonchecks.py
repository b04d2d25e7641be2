"""Checks of parsed JSON that untrusted input gets before anything else reads it.

Iterative, so a hostile document cannot exhaust the interpreter's stack
here; :func:`json.loads` itself raises RecursionError on a very deep one,
which callers turn into the same "too deep" answer.
"""

from __future__ import annotations

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
