"""``artsvc token create``: make a bearer token for the API; the secret is printed once, as stdout's last line."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from sqlmodel import Session

from service.auth import create_token
from service.settings import get_settings
from service.store import db as store_db
from service.store.tables import Role

from service.cli.app import app, console, fail

token_app = typer.Typer(help="API bearer tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

MAX_NAME = 128  # api_tokens.name


@token_app.command("create")
def create(
    role: Annotated[Role, typer.Option(help="client: submits and sees its own jobs; operator: sees and cancels all.")],
    name: Annotated[Optional[str], typer.Option(help="What the token is for [default: the role].")] = None,
) -> None:
    """Create a token (the database must be migrated: `artsvc db upgrade`)."""
    name = name or role.value
    if not 0 < len(name) <= MAX_NAME:
        raise fail(f"--name must be 1 to {MAX_NAME} characters")
    url = get_settings().resolved_database_url
    try:
        engine = store_db.make_engine(url)
        store_db.check_migrated(engine)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None
    with Session(engine) as session:
        row, secret = create_token(session, role=role, name=name)
        session.commit()
        console.print(f"created {role.value} token {row.id} ({name}); the secret is shown only now:", highlight=False)
    engine.dispose()
    typer.echo(secret)
