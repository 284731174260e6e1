"""The environment every artsvc process gives itself before litellm, tqdm or the Hugging Face Hub client is imported
(each reads its variable once, at import): no network at run time and no progress bars fighting rich's display.
``artsvc``'s ``main()`` applies them, so its worker processes inherit them; a benchmark that runs the service in
its own process applies them first. An operator's own values win."""

from __future__ import annotations

import os

PROCESS_DEFAULTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm (imported by ART) would fetch a price map from the network
    "HF_HUB_OFFLINE": "1",  # models load from local files only (models.py); never a Hub request
    "TQDM_DISABLE": "1",  # ART's gather bars would fight the rich progress display
}


def apply_process_defaults() -> None:
    """Set each default this process's environment lacks."""
    for name, value in PROCESS_DEFAULTS.items():
        os.environ.setdefault(name, value)
