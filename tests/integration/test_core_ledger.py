"""The credit ledger: exactly-once charges, idempotent top-ups, migrations."""

from __future__ import annotations

import threading
from decimal import Decimal

import psycopg
import pytest

from conveyor.errors import LedgerError, UnknownAccount
from conveyor.ledger import credits
from conveyor.schema.migrate import migrate, migration_files

PRICE = Decimal("0.002")


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def test_duplicate_charge_is_applied_once(conn):
    first = credits.consume(conn, user_id="u", task_id="t", message_id="m", total_tokens=1500, price_per_1k=PRICE)
    second = credits.consume(conn, user_id="u", task_id="t", message_id="m", total_tokens=1500, price_per_1k=PRICE)
    assert first == credits.EntryResult(True, Decimal("-0.003000"))
    assert second == credits.EntryResult(False, Decimal("-0.003000"))
    assert len(credits.entries(conn, "u")) == 1


def test_concurrent_duplicate_charges_apply_once(database_url):
    barrier = threading.Barrier(8)
    results = []

    def charge():
        with psycopg.connect(database_url, autocommit=True) as c:
            barrier.wait()
            results.append(
                credits.consume(
                    c, user_id="u", task_id="t", message_id="m", total_tokens=1000, price_per_1k=PRICE
                ).applied
            )

    threads = [threading.Thread(target=charge) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    with psycopg.connect(database_url) as c:
        assert credits.balance(c, "u") == Decimal("-0.002") and credits.verify(c) == []


def test_balance_may_go_negative_and_top_ups_are_idempotent(conn):
    credits.top_up(conn, user_id="u", amount=Decimal("1.5"), reference="stripe:1")
    credits.top_up(conn, user_id="u", amount=Decimal("1.5"), reference="stripe:1")
    credits.consume(conn, user_id="u", task_id="t", message_id="m", total_tokens=1_000_000, price_per_1k=PRICE)
    assert credits.balance(conn, "u") == Decimal("-0.5")
    assert credits.verify(conn) == []


def test_bad_top_up_and_unknown_account_are_clear_errors(conn):
    with pytest.raises(LedgerError, match="positive"):
        credits.top_up(conn, user_id="u", amount=Decimal("-1"), reference="r")
    with pytest.raises(UnknownAccount):
        credits.balance(conn, "nobody")


def test_entries_are_append_only(conn):
    credits.top_up(conn, user_id="u", amount=Decimal("1"), reference="r")
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        conn.execute("UPDATE credit_entries SET amount = 100")
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        conn.execute("DELETE FROM credit_entries")


def test_tampered_balance_is_found_by_verify(conn):
    credits.top_up(conn, user_id="u", amount=Decimal("1"), reference="r")
    conn.execute("UPDATE credit_accounts SET balance = 5 WHERE user_id = 'u'")
    assert credits.verify(conn) == [credits.Mismatch("u", Decimal("5"), Decimal("1"))]


def test_migrations_apply_once_even_when_two_run_at_once(make_database):
    url = make_database()
    results = []
    threads = [threading.Thread(target=lambda: results.append(migrate(url))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [p.name for p in migration_files()]
    # Each migration applied by exactly one of them (one may apply some, the other the rest), each in order.
    assert sorted(results[0] + results[1]) == names
    assert all(applied == sorted(applied) for applied in results)
    assert migrate(url) == []
    with psycopg.connect(url) as c:
        tables = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"credit_accounts", "credit_entries", "conveyor_migrations"} <= tables
