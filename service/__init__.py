"""artsvc: train agents with reinforcement learning through OpenPipe ART."""

import os

# litellm (imported by ART) fetches a price map at import unless told to use its local copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
