"""Admission's one async step for privacy: a name alone, in a request that could reach the
cloud under "keep-local", is asked of the privacy judge (`guard.privacy_judge`), which asks the
local model whether it knows every name (`guard.privacy_known`). Known names are public
figures: the request's facts drop `person`, and the policy sends it where it would send any
request (`RequestFacts.public_names` says so in the decision's reasons). A name the model does
not know, a judge out of time (the policy's first-token deadline, or the judge's own budget), or
any other finding beside the name keeps the request local, as before.

    facts = await clear_public_names(judge, ticket.request, policy, forced, facts)
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial

import anyio.to_thread

from hybridllm.engines.base import GenerationRequest
from hybridllm.events import EngineName
from hybridllm.guard.guarded import request_texts
from hybridllm.guard.privacy_judge import PrivacyJudge, person_names
from hybridllm.guard.privacy_ner import default_scanner, ner_wanted
from hybridllm.policy import Policy
from hybridllm.routing.decision import RequestFacts

log = logging.getLogger("hybridllm")
PERSON_ONLY = frozenset({"person"})


def worth_judging(
    judge: PrivacyJudge | None, policy: Policy, forced: EngineName | None, facts: RequestFacts
) -> bool:
    """Whether the judge can change where this request goes: a name alone was all the scan
    found, under "keep-local", in a request the policy and the caller let reach the cloud."""
    return (
        judge is not None
        and judge.clears_names
        and facts.privacy_kinds == PERSON_ONLY
        and policy.privacy.mode == "keep-local"
        and policy.cloud_allowed
        and forced != "local"
    )


async def clear_public_names(
    judge: PrivacyJudge | None,
    request: GenerationRequest,
    policy: Policy,
    forced: EngineName | None,
    facts: RequestFacts,
) -> RequestFacts:
    """`facts` without `person` where the judge knows every name as a public figure's, within
    the policy's first-token deadline; `facts` as they are otherwise."""
    if judge is None or not worth_judging(judge, policy, forced, facts):
        return facts
    sent = list(request_texts(request))
    scan = partial(default_scanner().scan, (), extra=sent, deep=ner_wanted(policy.privacy))
    found = await anyio.to_thread.run_sync(scan)  # the NER layer's cached result, off the loop
    names = person_names(found, sent)
    if not names or {f.kind for f in found} != PERSON_ONLY:
        return facts
    deadline = policy.routing.ttft_deadline_ms
    texts = [text for loc, text in sent if loc.endswith(".content")]
    verdict = await judge.verdict(texts, None if deadline is None else deadline / 1e3, names)
    if verdict.private:
        why = "its deadline" if verdict.missed_deadline else "a name it does not know"
        log.debug("privacy: judge kept a name alone local (%s)", why)
        return facts
    return dataclasses.replace(facts, privacy_kinds=frozenset(), public_names=len(names))
