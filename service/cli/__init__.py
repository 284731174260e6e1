"""``artsvc``: the command line of the service. Each module registers its verbs on ``app``."""

from service.cli import client, envs, evaluate, export, plot, serve, tokens, train, worker  # noqa: F401  (the verbs)
from service.cli.app import app


def main() -> None:
    app()
