"""conveyor ledger balance / top-up / verify."""

from __future__ import annotations

import argparse
import sys
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psycopg import Connection


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ledger", help="the credit ledger")
    lsub = p.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)
    b = lsub.add_parser("balance", help="a user's balance")
    b.add_argument("user")
    b.set_defaults(func=cmd_balance)
    t = lsub.add_parser("top-up", help="add credits, once per reference")
    t.add_argument("user")
    t.add_argument("amount")
    t.add_argument("--reference", required=True, help="idempotency reference of this top-up")
    t.set_defaults(func=cmd_top_up)
    v = lsub.add_parser("verify", help="check every balance equals the sum of its entries")
    v.set_defaults(func=cmd_verify)


def _conn() -> Connection[Any]:
    from conveyor.app import App
    from conveyor.db import connect, through_pooler
    from conveyor.schema.migrate import migrate

    app = App()
    migrate(app.database_url, app.blueprints)
    return connect(app.database_url, autocommit=True, **through_pooler(app.settings.database_pooled))


def cmd_balance(args: argparse.Namespace) -> int:
    from conveyor.ledger import credits

    with _conn() as conn:
        print(credits.balance(conn, args.user))
    return 0


def cmd_top_up(args: argparse.Namespace) -> int:
    from conveyor.errors import LedgerError
    from conveyor.ledger import credits

    try:
        amount = Decimal(args.amount)
    except InvalidOperation:
        raise LedgerError(f"not an amount: {args.amount!r}") from None
    with _conn() as conn:
        result = credits.top_up(conn, user_id=args.user, amount=amount, reference=args.reference)
    print(f"{'applied' if result.applied else 'already applied'}; balance {result.balance}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from conveyor.ledger import credits

    with _conn() as conn:
        mismatches = credits.verify(conn)
        size = credits.totals(conn)
    for m in mismatches:
        print(f"MISMATCH {m.user_id}: balance {m.balance} != entries {m.entries_sum}", file=sys.stderr)
    print(f"{size.accounts} accounts, {size.entries} entries, {len(mismatches)} mismatches")
    return 1 if mismatches else 0
