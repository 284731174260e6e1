"""Alembic environment: migrations run against the URL set on the config (see service.store.db)."""

from alembic import context
from sqlmodel import SQLModel

from service.store import tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from service.store.db import make_engine

target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    engine = make_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
