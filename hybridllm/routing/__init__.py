"""Routing: prompt features, the router's score and thresholds, the decision log, and the pure
decision of where a request runs (`decide`) with its inputs.

`Router` (the score: P(local answer wrong)), `DecisionLog` (SQLite; `RedisDecisionLog` for
several gateways, `decision_log_from_url` picks one) and `decide` are the public entry
points. Nothing here imports an engine or the runtime: routing is a pure function of facts,
policy and live state. Names load on first use; scikit-learn and skops load only to train, or
to load an artifact without its weights file (`artifact.read_weights`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridllm.lazy_names import lazy

# eager: the function shares its module's name, and a lazy look-up would find the module
from hybridllm.routing.decide import decide as decide

_NAMES = {
    "Decision": "hybridllm.routing.decision",
    "LiveState": "hybridllm.routing.decision",
    "Reason": "hybridllm.routing.decision",
    "ReasonCode": "hybridllm.routing.decision",
    "RequestFacts": "hybridllm.routing.decision",
    "RoutePreview": "hybridllm.routing.decision",
    "BudgetGate": "hybridllm.routing.inputs",
    "BudgetVerdict": "hybridllm.routing.inputs",
    "PrivacyScan": "hybridllm.routing.inputs",
    "Scorer": "hybridllm.routing.inputs",
    "DecisionLog": "hybridllm.routing.log",
    "DecisionLogLike": "hybridllm.routing.log",
    "SQLiteDecisionLog": "hybridllm.routing.log",
    "RedisDecisionLog": "hybridllm.routing.log_redis",
    "decision_log_from_url": "hybridllm.routing.logs",
    "Calibration": "hybridllm.routing.heads",
    "Router": "hybridllm.routing.router",
    "RouterScore": "hybridllm.routing.score",
}
__getattr__, __dir__ = lazy(__name__, _NAMES)
__all__ = sorted([*_NAMES, "decide"])

if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from hybridllm.routing.decision import (
        Decision as Decision,
        LiveState as LiveState,
        Reason as Reason,
        ReasonCode as ReasonCode,
        RequestFacts as RequestFacts,
        RoutePreview as RoutePreview,
    )
    from hybridllm.routing.heads import Calibration as Calibration
    from hybridllm.routing.inputs import (
        BudgetGate as BudgetGate,
        BudgetVerdict as BudgetVerdict,
        PrivacyScan as PrivacyScan,
        Scorer as Scorer,
    )
    from hybridllm.routing.log import (
        DecisionLog as DecisionLog,
        DecisionLogLike as DecisionLogLike,
        SQLiteDecisionLog as SQLiteDecisionLog,
    )
    from hybridllm.routing.log_redis import RedisDecisionLog as RedisDecisionLog
    from hybridllm.routing.logs import decision_log_from_url as decision_log_from_url
    from hybridllm.routing.router import Router as Router
    from hybridllm.routing.score import RouterScore as RouterScore
