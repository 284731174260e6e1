"""Integer arithmetic with a strict ``Final: <int>`` answer format."""

from environments.math.env import MathEnvironment
from environments.math.scorer import OUTCOMES, SCORER_VERSION, score

__all__ = ["MathEnvironment", "OUTCOMES", "SCORER_VERSION", "score"]
