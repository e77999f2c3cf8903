"""Routing: prompt features, the router's score and thresholds, the decision log, and the pure
decision of where a request runs (`decide`) with its inputs.

`Router` (the score: P(local answer wrong)), `DecisionLog` and `decide` are the public entry
points; scikit-learn and skops are imported only to train or load an artifact.
"""

from hybridllm.routing.decide import Decision, LiveState, RequestFacts, decide
from hybridllm.routing.inputs import BudgetGate, BudgetVerdict, PrivacyScan, Scorer
from hybridllm.routing.log import DecisionLog
from hybridllm.routing.router import Calibration, Router

__all__ = [
    "BudgetGate",
    "BudgetVerdict",
    "Calibration",
    "Decision",
    "DecisionLog",
    "LiveState",
    "PrivacyScan",
    "RequestFacts",
    "Router",
    "Scorer",
    "decide",
]
