"""Credits: consume, top up, balance, verify. Every change happens exactly once.

Amounts are ``Decimal`` with six places (``NUMERIC(20, 6)`` in Postgres):
never floats. A consumption may take a balance below zero: the tokens were
already used, and the negative balance is what shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import LedgerError, UnknownAccount
from conveyor.queries import load_queries

if TYPE_CHECKING:
    from psycopg import Connection

QUERIES = load_queries(Path(__file__).with_name("queries.sql"))

CENT = Decimal("0.000001")


@dataclass(frozen=True)
class EntryResult:
    """``applied`` is False when the reference had been applied before (nothing changed)."""

    applied: bool
    balance: Decimal | None


@dataclass(frozen=True)
class Mismatch:
    user_id: str
    balance: Decimal
    entries_sum: Decimal


@dataclass(frozen=True)
class Totals:
    """How many accounts and entries the ledger holds."""

    accounts: int
    entries: int


def consume_reference(task_id: str, message_id: str) -> str:
    """The ledger reference of one round's charge (the enqueue key's twin)."""
    return f"consume:{task_id}:{message_id}"


def cost(total_tokens: int, price_per_1k: Decimal) -> Decimal:
    """Credits for ``total_tokens`` at ``price_per_1k``, rounded half-up to six places."""
    return (Decimal(total_tokens) * price_per_1k / 1000).quantize(CENT, rounding=ROUND_HALF_UP)


def consume(
    conn: Connection[Any], *, user_id: str, task_id: str, message_id: str, total_tokens: int, price_per_1k: Decimal
) -> EntryResult:
    """Charge one round. Running it again for the same (task, message) changes nothing."""
    return _apply(
        conn,
        reference_id=consume_reference(task_id, message_id),
        user_id=user_id,
        kind="consume",
        amount=-cost(total_tokens, price_per_1k),
        tokens=total_tokens,
        task_id=task_id,
        message_id=message_id,
    )


def top_up(conn: Connection[Any], *, user_id: str, amount: Decimal, reference: str) -> EntryResult:
    """Add credits; the same ``reference`` twice adds them once."""
    amount = Decimal(amount).quantize(CENT, rounding=ROUND_HALF_UP)
    if amount <= 0:
        raise LedgerError(f"a top-up must be positive, got {amount}")
    return _apply(
        conn,
        reference_id=f"top_up:{reference}",
        user_id=user_id,
        kind="top_up",
        amount=amount,
        tokens=None,
        task_id=None,
        message_id=None,
    )


def _apply(conn: Connection[Any], **params: Any) -> EntryResult:
    row = conn.execute(QUERIES["apply_entry"], params).fetchone()
    if row is None:
        return EntryResult(False, balance(conn, params["user_id"]))
    new_balance: Decimal = row[0]
    return EntryResult(True, new_balance)


def balance(conn: Connection[Any], user_id: str) -> Decimal:
    """The user's balance; :class:`UnknownAccount` when they have no entries yet."""
    row = conn.execute(QUERIES["balance"], {"user_id": user_id}).fetchone()
    if row is None:
        raise UnknownAccount(f"no credit account for user {user_id!r}")
    value: Decimal = row[0]
    return value


def entries(conn: Connection[Any], user_id: str) -> list[tuple[Any, ...]]:
    """The user's entries as rows, oldest first."""
    rows: list[tuple[Any, ...]] = conn.execute(QUERIES["entries"], {"user_id": user_id}).fetchall()
    return rows


def verify(conn: Connection[Any]) -> list[Mismatch]:
    """Every account whose balance differs from the sum of its entries (empty when the ledger is sound)."""
    return [Mismatch(*row) for row in conn.execute(QUERIES["verify"]).fetchall()]


def totals(conn: Connection[Any]) -> Totals:
    """The ledger's size: accounts and entries (what ``conveyor ledger verify`` reports beside the mismatches)."""
    row = conn.execute(QUERIES["totals"]).fetchone()
    assert row is not None  # two counts: always one row
    return Totals(*row)
