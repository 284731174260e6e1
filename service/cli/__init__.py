"""``artsvc``: the command line of the service. Each module registers its verbs on ``app``, in the order of the
imports below (the order ``artsvc --help`` lists them)."""

from service.cli import remote, envs, evaluate, export, chat, plot, serve, tokens, train, worker, db  # noqa: F401
from service.cli.app import app
from service.process_env import PROCESS_DEFAULTS, apply_process_defaults

__all__ = ["PROCESS_DEFAULTS", "app", "main"]


def main() -> None:
    """The ``artsvc`` command, and ``python -m service`` (so every worker process too). The process defaults are set
    first: importing this package imports neither litellm nor tqdm (a test checks), so no verb has read them yet."""
    apply_process_defaults()
    app()
