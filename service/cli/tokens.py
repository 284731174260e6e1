"""``artsvc token``: bearer tokens for the API, managed where the database is. ``create`` prints the secret once, as
stdout's last line; ``list`` shows every token but never a secret or its hash; ``revoke`` ends a token for good (its
bearer use, its dashboard sessions and new logins are refused from the next request on)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Column, Table
from sqlmodel import Session

from service.auth import create_token
from service.settings import get_settings
from service.store import db as store_db
from service.store import tokens
from service.store.tables import Role

from service.cli.app import app, console, fail

token_app = typer.Typer(help="API bearer tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

MAX_NAME = 128  # api_tokens.name


@contextmanager
def _store() -> Iterator[Session]:
    """A session on the configured database, which must be migrated (exit 2 saying what to run if not)."""
    try:
        engine = store_db.make_engine(get_settings().resolved_database_url)
        store_db.check_migrated(engine)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


@token_app.command("create")
def create(
    role: Annotated[Role, typer.Option(help="client: submits and sees its own jobs; operator: sees and cancels all.")],
    name: Annotated[Optional[str], typer.Option(help="What the token is for [default: the role].")] = None,
) -> None:
    """Create a token (the database must be migrated: `artsvc db upgrade`)."""
    name = name or role.value
    if not 0 < len(name) <= MAX_NAME:
        raise fail(f"--name must be 1 to {MAX_NAME} characters")
    with _store() as session:
        row, secret = create_token(session, role=role, name=name)
        session.commit()
        console.print(f"created {role.value} token {row.id} ({escape(name)}); the secret is shown only now:",
                      highlight=False)  # fmt: skip
    typer.echo(secret)


@token_app.command("list")
def list_tokens(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per token, one per line.")] = False,
) -> None:
    """List every token, oldest first: id, name, role, when it was created, last used (to the minute; by the API, a
    bearer request or a dashboard session) and revoked. Never a secret."""
    with _store() as session:
        found = tokens.list_tokens(session)
    if as_json:
        for token in found:
            typer.echo(token.model_dump_json())
        return
    table = Table(Column("id", no_wrap=True, min_width=36), "name", Column("role", no_wrap=True),  # id whole: `revoke` takes it
                  "created (UTC)", "last used", "revoked")  # fmt: skip
    for token in found:
        table.add_row(token.id, escape(token.name), token.role.value, _when(token.created_at),
                      _when(token.last_used_at, never="never"), _when(token.revoked_at, never=""))  # fmt: skip
    console.print(table)


@token_app.command("revoke")
def revoke(token_id: Annotated[str, typer.Argument(metavar="ID", help="The token's id (see `artsvc token list`).")]) -> None:
    """Revoke a token for good: requests with it, and dashboard sessions opened with it, are refused from their next
    request on. Revoking a revoked token changes nothing and says so."""
    with _store() as session:
        try:
            token, revoked_now = tokens.revoke_token(session, token_id=token_id)
        except tokens.UnknownToken:
            raise fail(f"no token {token_id!r}: see `artsvc token list`") from None
        session.commit()
    said = "revoked" if revoked_now else f"was already revoked at {_when(token.revoked_at)} UTC; nothing changed"
    console.print(f"{token.role.value} token {token.id} ({escape(token.name)}) {said}", soft_wrap=True, highlight=False)


def _when(moment: datetime | None, *, never: str = "") -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment is not None else never
