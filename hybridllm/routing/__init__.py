"""Routing: prompt features, the router's score and thresholds, the decision log.

`Router` (the score: P(local answer wrong)) and `DecisionLog` are the public entry points;
scikit-learn and skops are imported only to train or load an artifact.
"""

from hybridllm.routing.log import DecisionLog
from hybridllm.routing.router import Calibration, Router

__all__ = ["Calibration", "DecisionLog", "Router"]
