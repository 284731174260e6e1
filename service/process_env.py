"""The environment every artsvc process gives itself before litellm, tqdm, the Hugging Face Hub client or oneDNN reads
it (each reads its variable once): no network at run time, no progress bars fighting rich's display, and a bounded
cache of oneDNN's compiled products.
``artsvc``'s ``main()`` applies them, so its worker processes inherit them; a benchmark that runs the service in
its own process applies them first. An operator's own values win."""

from __future__ import annotations

import os

PROCESS_DEFAULTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm (imported by ART) would fetch a price map from the network
    "HF_HUB_OFFLINE": "1",  # models load from local files only (models.py); never a Hub request
    "TQDM_DISABLE": "1",  # ART's gather bars would fight the rich progress display
    # oneDNN (torch's bf16 products on a CPU) keeps up to 1,024 compiled products, one per shape, each with its own
    # buffers. Training passes come in many shapes (their rows' positions), and the cache grew the main job's heap by
    # about 0.3 GiB over 9 steps, to a peak 0.25 GiB higher; 64 bound it, and a step's sampling took as long as with
    # 1,024 (2.24 against 2.22 s; with none cached, 7.4 s). README, Results, "Activations kept".
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
}


def apply_process_defaults() -> None:
    """Set each default this process's environment lacks."""
    for name, value in PROCESS_DEFAULTS.items():
        os.environ.setdefault(name, value)
