"""users and keys: producer accounts and their API keys (``Authorization: Bearer <key>``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.cli import Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser("users", help="producer accounts: create")
    users = p.add_subparsers(dest="users_command", metavar="ACTION", required=True)
    q = users.add_parser("create", help="create a user (its id is the user_id its tasks and resources carry)")
    q.add_argument("name")
    q.set_defaults(func=cmd_users_create)

    p = sub.add_parser("keys", help="API keys of producer accounts: create, list, revoke")
    keys = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    q = keys.add_parser("create", help="a new key for USER, printed once (only its hash is kept)")
    q.add_argument("user")
    q.set_defaults(func=cmd_keys_create)
    q = keys.add_parser("list", help="USER's keys: id, created, revoked (never the key)")
    q.add_argument("user")
    q.add_argument("--json", action="store_true", help="print JSON lines")
    q.set_defaults(func=cmd_keys_list)
    q = keys.add_parser("revoke", help="revoke a key by its id: it stops working at once")
    q.add_argument("key_id")
    q.set_defaults(func=cmd_keys_revoke)


def _app() -> App:
    from conveyor.app import App
    from conveyor.logs import configure_logging
    from conveyor.schema.migrate import migrate

    app = App()
    configure_logging(app.settings.log_level, secrets=app.secret_values())
    migrate(app.database_url, app.blueprints)
    return app


def cmd_users_create(args: argparse.Namespace) -> int:
    from conveyor import access

    app = _app()
    try:
        with app.pool.connection() as conn:
            try:
                created = access.create_user(conn, args.name)
            except ValueError as exc:
                print(f"conveyor: error: {exc}", file=sys.stderr)
                return 2
    finally:
        app.close()
    print(f"user {args.name} {'created' if created else 'exists already'}")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from conveyor import access

    app = _app()
    try:
        with app.pool.connection() as conn:
            key_id, key = access.create_api_key(conn, args.user)
    finally:
        app.close()
    print(f"key {key_id} for {args.user} (shown once; conveyor keeps only its hash):", file=sys.stderr)
    print(key)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from conveyor import access

    app = _app()
    try:
        with app.pool.connection() as conn:
            keys = access.api_keys(conn, args.user)
    finally:
        app.close()
    for key in keys:
        revoked_at = key.revoked_at.isoformat() if key.revoked_at else None
        row = {"id": key.id, "user": key.user_id, "created_at": key.created_at.isoformat(), "revoked_at": revoked_at}
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{key.id}  {row['created_at']}  {'revoked ' + revoked_at if revoked_at else 'live'}")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from conveyor import access

    app = _app()
    try:
        with app.pool.connection() as conn:
            user = access.revoke_api_key(conn, args.key_id)
    finally:
        app.close()
    print(f"key {args.key_id} of {user} revoked")
    return 0
