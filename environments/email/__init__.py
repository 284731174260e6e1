"""Email search with tools, in the manner of OpenPipe's ART-E: find a fact in an inbox and cite it.

Exports resolve on first use, so that ``python -m environments.email.corpus`` (which regenerates
the data) runs without importing ART or the modules that read the committed corpus.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "EmailEnvironment": "environments.email.env",
    "Episode": "environments.email.episode",
    "EpisodeResult": "environments.email.episode",
    "demonstrator": "environments.email.agents",
    "oracle": "environments.email.agents",
    "play": "environments.email.agents",
    "random_agent": "environments.email.agents",
    "read_email": "environments.email.search",
    "search_inbox": "environments.email.search",
    "tool_specs": "environments.email.tools",
    "toolbox": "environments.email.tools",
    "OUTCOMES": "environments.email.verifier",
    "SCORER_NAME": "environments.email.verifier",
    "SCORER_VERSION": "environments.email.verifier",
    "shaped_reward": "environments.email.verifier",
    "verify": "environments.email.verifier",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from environments.email.agents import demonstrator, oracle, play, random_agent
    from environments.email.env import EmailEnvironment
    from environments.email.episode import Episode, EpisodeResult
    from environments.email.search import read_email, search_inbox
    from environments.email.tools import tool_specs, toolbox
    from environments.email.verifier import OUTCOMES, SCORER_NAME, SCORER_VERSION, shaped_reward, verify


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
