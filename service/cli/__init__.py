"""``artsvc``: the command line of the service. Each module registers its verbs on ``app``, in the order of the
imports below (the order ``artsvc --help`` lists them)."""

import os

from service.cli import remote, envs, evaluate, export, chat, plot, serve, tokens, train, worker, db  # noqa: F401
from service.cli.app import app

# Read once, when litellm and tqdm are first imported: main() sets them before any verb imports either (importing
# this package imports neither, a test checks). The operator's own values win; worker processes inherit them.
PROCESS_DEFAULTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm (imported by ART) would fetch a price map from the network
    "TQDM_DISABLE": "1",  # ART's gather bars would fight the rich progress display
}


def main() -> None:
    """The ``artsvc`` command, and ``python -m service`` (so every worker process too)."""
    for name, value in PROCESS_DEFAULTS.items():
        os.environ.setdefault(name, value)
    app()
