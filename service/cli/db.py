"""``artsvc db upgrade``: migrate the store."""

from __future__ import annotations

from service.settings import get_settings
from service.store import db as store_db

from service.cli.app import console, db_app, fail


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the configured database to the newest schema."""
    settings = get_settings()
    try:
        store_db.upgrade(settings.resolved_database_url)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None
    console.print(f"database at {settings.resolved_database_url} is up to date")
