"""``artsvc chat``: one question to a job's checkpoint through the API's OpenAI chat completions, the reply printed.
For a job trained with ``artsvc train``, start ``artsvc serve --local`` first (chat needs the server's model process)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape

from service.cli.app import app, console, fail
from service.cli.export import STEP
from service.cli.remote import ApiUrlOption, TokenOption, api_client

FIRST_ANSWER_S = 300.0  # the first request of a checkpoint waits for its model to load


@app.command()
def chat(
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID", help="The job's id.")],
    message: Annotated[str, typer.Argument(metavar="MESSAGE", help="What to ask, as the user's turn.")],
    step: Annotated[str, typer.Option(help="best (the best validation step, else the latest), latest, or a number.")] = "best",
    system: Annotated[Optional[str], typer.Option(help="A system turn before the message.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Tokens of the reply at most (default: the server's).")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0, max=2, help="Sampling temperature (default: 1).")] = None,
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
) -> None:
    """Ask a job's checkpoint one question through `POST /v1/chat/completions`; prints the reply on stdout."""
    if not STEP.match(step):
        raise fail(f"--step must be best, latest or a step number, not {step!r}")
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": message}
    ]
    model = job_id if step == "best" else f"{job_id}@{step}"
    with api_client(api_url, token, refused="the API refused the chat", timeout_s=FIRST_ANSWER_S) as client:
        reply = client.chat(model, messages, max_tokens=max_tokens, temperature=temperature)
    console.print(f"{escape(reply['model'])}:", highlight=False)
    typer.echo(reply["choices"][0]["message"]["content"] or "")
