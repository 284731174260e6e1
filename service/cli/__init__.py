"""``artsvc``: the command line of the service. Each module registers its verbs on ``app``, in the order of the
imports below (the order ``artsvc --help`` lists them)."""

from service.cli import remote, envs, evaluate, export, plot, serve, tokens, train, worker, db  # noqa: F401
from service.cli.app import app


def main() -> None:
    app()
