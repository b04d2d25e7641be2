"""The ledger's arithmetic: exact decimal costs, rounded half-up to the millionth."""

from __future__ import annotations

from decimal import Decimal

from conveyor.ledger import credits


def test_amounts_are_exact_decimals():
    assert credits.cost(1, Decimal("0.002")) == Decimal("0.000002")
    assert credits.cost(333, Decimal("0.001")) == Decimal("0.000333")
    assert credits.cost(1, Decimal("0.0015")) == Decimal("0.000002")  # half-up
