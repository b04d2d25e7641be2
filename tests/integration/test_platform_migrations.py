"""The platform's tables travel with its blueprint: a library user's migrations leave them out, and a
database migrated before the platform's migrations moved into its package has nothing left to apply."""

from __future__ import annotations

import psycopg

from conveyor.platform.blueprint import jobs as platform
from conveyor.schema.migrate import MIGRATIONS, migrate, migration_files

#: Every migration a database migrated by the release before the move recorded, under these names.
RECORDED_BEFORE_THE_MOVE = [
    "0001_ledger.sql",
    "0010_jobs.sql",
    "0011_jobs_fences.sql",
    "0030_platform.sql",
    "0040_schedules.sql",
    "0041_pauses_nudges.sql",
    "0042_builds.sql",
    "0045_fleet.sql",
    "0050_access.sql",
    "0051_session_epoch.sql",
    "0060_results.sql",
    "0062_resources_per_user.sql",
    "0063_user_quotas.sql",
    "0064_job_steps.sql",
    "0065_jobs_recovery_clock.sql",
    "0066_budgets.sql",
    "0070_rollup.sql",
]
PLATFORM_MIGRATIONS = [
    "0030_platform.sql",
    "0040_schedules.sql",
    "0041_pauses_nudges.sql",
    "0042_builds.sql",
    "0062_resources_per_user.sql",
    "0063_user_quotas.sql",
]
PLATFORM_TABLES = {"tasks", "runs", "schedules", "builds", "agents", "nudges", "stream_leases"}


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_a_library_apps_migrations_create_no_platform_table_until_its_app_includes_the_platform(make_database):
    url = make_database()
    library = migrate(url)
    assert library == [p.name for p in migration_files()] and not set(library) & set(PLATFORM_MIGRATIONS)
    assert not _tables(url) & PLATFORM_TABLES and {"conveyor_jobs", "credit_accounts", "users"} <= _tables(url)
    # An App that adds the platform later gets exactly its migrations, the library's being done.
    assert migrate(url, [platform]) == PLATFORM_MIGRATIONS
    assert PLATFORM_TABLES <= _tables(url)
    assert migrate(url, [platform]) == [] and migrate(url) == []


def test_a_database_migrated_before_the_move_applies_nothing_again(make_database):
    url = make_database()
    files = {p.name: p for p in migration_files([platform])}
    newer = sorted(set(files) - set(RECORDED_BEFORE_THE_MOVE))  # added since the move (cancel, event waits, …)
    assert set(RECORDED_BEFORE_THE_MOVE) <= set(files), "no migration renamed or lost"
    assert all(name > RECORDED_BEFORE_THE_MOVE[-1] for name in newer), "a new migration numbered before older ones"
    # What the migrator before the move did: every file, in order, recorded by its bare name.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE conveyor_migrations (name TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for name in RECORDED_BEFORE_THE_MOVE:
            with conn.transaction():
                conn.execute(files[name].read_text())
                conn.execute("INSERT INTO conveyor_migrations (name) VALUES (%s)", (name,))
    assert migrate(url, [platform]) == newer, "only what came after, nothing again"
    assert migrate(url, [platform]) == [] and migrate(url) == []


def test_the_platforms_migrations_live_in_its_package_not_the_librarys():
    assert not {p.name for p in MIGRATIONS.glob("*.sql")} & set(PLATFORM_MIGRATIONS)
    assert [p.name for p in migration_files([platform]) if p.parent != MIGRATIONS] == PLATFORM_MIGRATIONS
