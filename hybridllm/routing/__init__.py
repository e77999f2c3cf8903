"""Routing: the pure decision of where a request runs (`decide`), and its inputs."""

from hybridllm.routing.decide import Decision, LiveState, RequestFacts, decide
from hybridllm.routing.inputs import BudgetGate, BudgetVerdict, PrivacyScan, Router

__all__ = [
    "BudgetGate",
    "BudgetVerdict",
    "Decision",
    "LiveState",
    "PrivacyScan",
    "RequestFacts",
    "Router",
    "decide",
]
