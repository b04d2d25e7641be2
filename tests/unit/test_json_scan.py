"""The byte scan of a JSON body (conveyor.jsonchecks.scan_json_bytes) judges as a parse would."""

from __future__ import annotations

import json
import random

import pytest

from conveyor.jsonchecks import holds_nul, json_depth_exceeds, scan_json_bytes


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"a": [1, {"b": [[[]]]}], "c": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', None),
        (b"[" * 32 + b"]" * 32, None),
        (b"[" * 33 + b"]" * 33, "nested deeper than 32 levels"),
        (b"[" * 500, "nested deeper than 32 levels"),  # malformed, but the parser would recurse that deep
        (b'{"k": "\\\\u0000", "q": "\\"]]]}}}"}', None),  # an escaped backslash, then the text u0000
        (b'{"k": "\\\\\\u0000"}', "NUL characters are not allowed"),
        (b'{"\\u0000": 1}', "NUL characters are not allowed"),
        (b'"a\x00b"', "NUL characters are not allowed"),
        (b"[" + b"{}," * 1000 + b"{}]", "holds more than 1000 values"),
        (b"[" + b"1," * 998 + b"1]", None),
    ],
)
def test_the_scan_finds_what_is_wrong(body, expected):
    assert scan_json_bytes(body, 32, 1000) == expected


def test_the_scan_agrees_with_a_parse_on_random_documents():
    rng = random.Random(17)
    texts = ["x", "]", "}[", '"', "\\", "\x00", "\\u0000", "é"]
    for _ in range(2000):
        root: list | dict = []
        node = root
        for level in range(rng.randint(0, 40)):
            child: list | dict = [] if rng.random() < 0.5 else {}
            text = "".join(rng.choices(texts, k=rng.randint(0, 3)))
            if isinstance(node, list):
                node.extend([text, child, level])
            else:
                node[text] = child
            node = child
        body = json.dumps(root, ensure_ascii=rng.random() < 0.5).encode()
        expected = (
            "NUL characters are not allowed"
            if holds_nul(root)
            else "nested deeper than 32 levels"
            if json_depth_exceeds(root, 32)
            else None
        )
        assert scan_json_bytes(body, 32, 10_000) == expected, body
