"""Policies: per-scenario settings as validated, frozen data, in tables.

A policy is a TOML file: a preset in `policies/`, or a user file in a directory on the policy
path (`policy_dirs=` / `--policy-dir`, then `$HYBRIDLLM_POLICY_PATH`, then the presets). A file
may build on another with `extends = "chat"` (looked up beside the file, then on the path; a file
extending the name it shadows gets the next one down; tables are merged key by key). Loading is
the second half of this module. Every field is optional; one name per knob:

    name, description, priority, plans, plan              top level: what it is, which plans run
    [sampling]    temperature, top_p, stop, max_tokens
    [routing]     prefer, allow_cloud, fallback_order, ttft_deadline_ms, tpot_target_ms,
                  stall_ms, retries, router_threshold | target_cloud_share | quality_floor,
                  tiers with tier_bounds | tier_shares
    [hedge]       after_ms, device_weight, cloud_price_ms, parallel_cloud, parallel_cloud_share
    [handoff]     after_tokens, warm_cloud, continuer
    [cascade]     hold_tokens, hold_ms, hedge, judge, escalation
    [speculative] show_drafts, max_prompt_overhead, k, ahead, verifier
    [budget]      per_request_usd, per_day_usd, per_month_usd, per_user_day_usd,
                  per_user_month_usd, on_exceeded
    [limits]      per_user_rpm
    [privacy]     mode = "off" | "keep-local" | "block", ner
    [tools]       min_call_confidence, min_tool_fit

Python builds the same shape: `Policy(routing={"prefer": "cloud"}, hedge={"after_ms": 200})`,
or from a preset with a few fields changed: `Policy.preset("chat").with_(routing={...})`. A flat
field of the old form (`hedge_after_ms = 200`, `Policy(prefer="cloud")`) is a `PolicyError`
naming its new place; `hybridllm policy migrate FILE` rewrites an old file (`MOVED`).

How the client's own settings combine with a policy's (`Policy.under_client`, the one place):
the client's `privacy=` is a floor (the stricter of the two modes wins: off < keep-local <
block); the client's `budget_caps=` hold beside the policy's `[budget]` caps (every cap must
hold); everything else is the policy's, and a call's arguments (`max_tokens=`, `plan=`, ...)
override the policy for that call.

Checked the same way from a file and from Python: numbers are finite (no NaN, no inf), counts
are ints (not bools, floats or strings), and a bad field is a `PolicyError` naming it (`.field`,
dotted: "hedge.after_ms"), never pydantic's own error. Ranges: temperature 0 to 2, top_p in
(0, 1], max_tokens >= 1, retries 0 to 10, deadlines and delays > 0 ms (hedge >= 0), router
threshold / cloud share / quality floor 0 to 1, budget caps >= 0 USD, stop strings non-empty.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from hybridllm.errors import InvalidArgumentError, PolicyError
from hybridllm.events import Priority

# the hard ceiling of max_tokens, in a policy and per call: the largest context an engine may claim
MAX_TOKENS = 2**20
# a plan's name: a built-in plan's, or one a module registered (`runtime.plans.registry`)
PlanName = str
BuiltinPlan = Literal["single", "hedge", "handoff", "cascade", "speculative"]
PLAN_NAMES: tuple[BuiltinPlan, ...] = ("single", "hedge", "handoff", "cascade", "speculative")
# the plans that split an answer between engines or verify it piece by piece: none runs for a
# tool call or a JSON answer, which is delivered whole
SPLITTING_PLANS: set[PlanName] = {"handoff", "cascade", "speculative"}
_REGISTERED: list[PlanName] = []  # the names `register_plan_name` added, in order
# the policy tables registered plans declared, by plan name (`[shout]` in a policy file)
_PLAN_TABLES: dict[PlanName, type[BaseModel]] = {}


def register_plan_name(
    name: PlanName, *, splits: bool, table: type[BaseModel] | None = None
) -> None:
    """A plan a module registered (`runtime.plans.registry.register`): policies and calls may
    name it from now on; `splits`: it may split an answer (so it never runs for a tool call or
    a JSON answer); `table`: the plan's own policy table, a pydantic model (a policy's `[name]`
    table, validated by it: `Policy.plan_table(name)`). A name already taken (by a plan or a
    policy field) is a `PolicyError`."""
    if not name or not name.replace("-", "_").isidentifier():
        raise PolicyError(f"a plan's name is a word (letters, digits, '-', '_'): {name!r}")
    if name in plan_names() or name in Policy.model_fields:
        raise PolicyError(f"a plan named {name!r} is already registered", field="plan")
    _REGISTERED.append(name)
    if splits:
        SPLITTING_PLANS.add(name)
    if table is not None:
        _PLAN_TABLES[name] = table


def plan_names() -> tuple[PlanName, ...]:
    """Every plan a policy or a call may name: the built-in ones, then the registered ones."""
    return (*PLAN_NAMES, *_REGISTERED)


def _known_plan(name: str) -> str:
    if name not in plan_names():
        raise ValueError(f"Input should be one of {', '.join(map(repr, plan_names()))}")
    return name


# a plan's name in a policy: one that is built in or registered
KnownPlan = Annotated[str, AfterValidator(_known_plan)]


# an engine a policy names: the sides "local" (the device) and "cloud" (the clouds, in the
# client's order), or the name the app gave an engine (`HybridClient(engines={"smart": ...})`;
# a name the client does not hold is a `PolicyError` when the client opens or takes the policy)
SIDE_WORDS = ("local", "cloud")
_ENGINE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")


def _engine_choice(value: str) -> str:
    if not _ENGINE_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an engine: 'local', 'cloud', or an engine's name (a letter, then "
            "letters, digits, _ . -)"
        )
    return value


EngineChoice = Annotated[str, AfterValidator(_engine_choice)]


def _init(model: BaseModel, **data: Any) -> None:
    """pydantic's __init__, with its ValidationError as a PolicyError naming the field."""
    try:
        BaseModel.__init__(model, **data)
    except ValidationError as exc:
        msg, loc, close = _described(exc, type(model))
        raise PolicyError(msg, field=".".join(loc) or None, suggestion=close) from None


# pydantic validates nested and file data without calling a model's own __init__ when it is
# marked as its base one: a bad field deep in a file stays a ValidationError for `_load`
_init.__pydantic_base_init__ = True  # type: ignore[attr-defined]


def _described(exc: ValidationError, model: type[BaseModel]) -> tuple[str, list[str], str | None]:
    """The first error's message, in words, its location (field names), and for an unknown
    field the closest known name (None: none is close)."""
    err = exc.errors()[0]
    loc = [str(x) for x in err["loc"]]
    msg = err["msg"].removeprefix("Value error, ")
    close: str | None = None
    if err["type"] == "extra_forbidden":
        if len(loc) > 1 and loc[0] in TABLES:
            model = TABLES[loc[0]]
        known = list(model.model_fields)
        found = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
        close = found[0] if found else None
        hint = f"did you mean {close}? " if close else ""
        msg = f"unknown field; {hint}known fields: {', '.join(known)}"
    elif loc:
        msg += f" (got {err['input']!r})"
    return msg, loc, close


def _number(v: object) -> object:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise ValueError("must be a number")
    return v


def _count(v: object) -> object:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise ValueError("must be an int")
    return v


class _Table(BaseModel):
    """One table of a policy: frozen, no unknown keys, finite numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    if not TYPE_CHECKING:  # type checkers keep pydantic's own signature
        __init__ = _init


class SamplingTable(_Table):
    """`[sampling]`: the defaults of a request's sampling (a call's arguments override them),
    and `overflow`: what a prompt that outgrew an engine's context does. "route" (default):
    routing sends it to an engine that can hold it (`ContextOverflowError` where none can);
    "trim": the oldest turns after the system message are dropped until it fits the local
    context (tool calls kept with their results; `Trace.trimmed_messages` says how many), then
    routing as "route"; "error": `ContextOverflowError` at once, where any engine the policy
    allows cannot hold it."""

    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()
    max_tokens: int = Field(default=256, ge=1, le=MAX_TOKENS)
    overflow: Literal["route", "trim", "error"] = "route"

    _numbers = field_validator("temperature", "top_p", mode="before")(_number)
    _counts = field_validator("max_tokens", mode="before")(_count)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError('must be a list of strings, e.g. ["END"]')
        if isinstance(v, list | tuple) and not all(isinstance(s, str) and s for s in v):
            raise ValueError("each stop string must be a non-empty string")
        return v


_ROUTING_NUMBERS = (
    "ttft_deadline_ms",
    "tpot_target_ms",
    "stall_ms",
    "router_threshold",
    "target_cloud_share",
    "quality_floor",
)
_ROUTING_FIELDS = (
    "prefer",
    "allow_cloud",
    "fallback_order",
    "tiers",
    "tier_bounds",
    "tier_shares",
    "retries",
    "objective",
    *_ROUTING_NUMBERS,
)


class RoutingTable(_Table):
    """`[routing]`: where a request may run, its deadlines, and how the router's score is read
    (at most one of `router_threshold`, `target_cloud_share`, `quality_floor`; the score is
    P(the local answer is wrong))."""

    # "auto" (the router's choice), "local", "cloud", or an engine's name
    prefer: EngineChoice = "auto"
    allow_cloud: bool = True
    # why the policy's first engine is preferred (`Decision.objective`): "quality", a cloud
    # wanted for its answer (a local backup only rescues it: held until the deadline), or
    # "latency" (the first token wins). None: "quality" when the cloud comes first, else
    # "latency". The router's choice ("auto") carries its own: quality for the cloud.
    objective: Literal["quality", "latency"] | None = None
    # engines that may serve, in order (first: primary unless routing moves it); None: from
    # `prefer` (cloud first for "cloud", else local first). One engine: no fallback.
    fallback_order: tuple[EngineChoice, ...] | None = None
    ttft_deadline_ms: float | None = Field(default=None, gt=0)
    # the decode speed the scenario needs (ms per output token after the first)
    tpot_target_ms: float | None = Field(default=None, gt=0)
    # a serving engine silent for longer than this mid-answer counts as failed (failover)
    stall_ms: float | None = Field(default=None, gt=0)
    # retries of retryable failures before the first token (never past the deadline)
    retries: int = Field(default=2, ge=0, le=10)
    router_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    target_cloud_share: float | None = Field(default=None, ge=0.0, le=1.0)
    quality_floor: float | None = Field(default=None, ge=0.0, le=1.0)
    # tiers by difficulty: the engines from the easiest requests' to the hardest's (the
    # router's score, P(the local answer is wrong), picks the step), with one bound per step:
    # `tier_bounds` (scores: step i+1 from bound i on, increasing) or `tier_shares` (the share of
    # requests that reach step i+1 or above, decreasing; read on the router's calibration)
    tiers: tuple[EngineChoice, ...] | None = None
    tier_bounds: tuple[float, ...] | None = None
    tier_shares: tuple[float, ...] | None = None

    _numbers = field_validator(*_ROUTING_NUMBERS, mode="before")(_number)
    _counts = field_validator("retries", mode="before")(_count)

    @field_validator("tier_bounds", "tier_shares", mode="before")
    @classmethod
    def _steps(cls, v: object) -> object:
        if isinstance(v, list | tuple):
            for x in v:
                _number(x)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        stated = ("router_threshold", "target_cloud_share", "quality_floor")
        given = [f for f in stated if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of {', '.join(given)} (they all set the threshold)")
        order = self.fallback_order
        if order is not None:
            if not order or len(set(order)) != len(order) or "auto" in order:
                raise ValueError(
                    "fallback_order: distinct engines ('local', 'cloud' or engines' names)"
                )
            named = self.prefer in order or {self.prefer, order[0]} <= set(SIDE_WORDS)
            if self.prefer != "auto" and named and order[0] != self.prefer:
                raise ValueError(
                    f"fallback_order starts with {order[0]!r} but prefer is {self.prefer!r}"
                )
            if order == ("cloud",) and not self.allow_cloud:
                raise ValueError("fallback_order allows only the cloud but allow_cloud is false")
        if self.prefer == "cloud" and not self.allow_cloud:
            raise ValueError("prefer is 'cloud' but allow_cloud is false")
        self._check_tiers(given)
        return self

    def _check_tiers(self, thresholds: list[str]) -> None:
        """Tiers: distinct engines (two or more, "auto" not one), the device's first where
        listed, one bound per step (bounds increasing, shares decreasing, both in (0, 1]),
        under `prefer = "auto"`, without a fixed order or another threshold."""
        tiers, bounds, shares = self.tiers, self.tier_bounds, self.tier_shares
        if tiers is None:
            if bounds is not None or shares is not None:
                raise ValueError("tier_bounds / tier_shares need tiers")
            return
        if len(tiers) < 2 or len(set(tiers)) != len(tiers) or "auto" in tiers:
            raise ValueError("tiers: two or more distinct engines ('local', 'cloud' or names)")
        if "local" in tiers[1:]:
            raise ValueError("tiers: 'local' (the device) can only be the first, easiest tier")
        if self.prefer != "auto" or self.fallback_order is not None or thresholds:
            raise ValueError(
                "tiers pick the engine by the router's score: give them with prefer = 'auto', "
                "no fallback_order and no router_threshold / target_cloud_share / quality_floor"
            )
        if not self.allow_cloud:
            raise ValueError("tiers name clouds but allow_cloud is false")
        if (bounds is None) == (shares is None):
            raise ValueError("tiers: give exactly one of tier_bounds or tier_shares")
        steps = bounds if bounds is not None else shares
        assert steps is not None
        if len(steps) != len(tiers) - 1:
            raise ValueError(
                f"tiers: {len(tiers)} tiers need {len(tiers) - 1} bounds, one per step "
                f"(got {len(steps)})"
            )
        pairs = list(zip(steps, steps[1:], strict=False))
        if not all(0.0 < x <= 1.0 for x in steps):
            raise ValueError("tier_bounds / tier_shares: numbers in (0, 1]")
        if bounds is not None and not all(a < b for a, b in pairs):
            raise ValueError("tier_bounds: router scores, increasing")
        if shares is not None and not all(a > b for a, b in pairs):
            raise ValueError("tier_shares: shares in (0, 1], decreasing")


class HedgeTable(_Table):
    """`[hedge]`: a second engine started before the first has answered.

    `after_ms`: start the backup this long after the call even before the deadline; "auto": the
    delay that minimises the expected p99 TTFT plus the hedge's price (`routing.hedging`), from
    the primary's observed TTFT distribution (once a few requests have been seen). The price of
    an automatic hedge, in ms of p99 TTFT it must buy: a local hedge costs device time only
    (`device_weight` times its predicted time to a first token; 0: free); a cloud hedge costs a
    cloud request paid for (`cloud_price_ms`).

    Where the cloud was chosen for quality (the router's score, `prefer = "cloud"`), a local
    backup (a hedge, the deadline's fallback) is a rescue: it may start early and prefill, but
    its tokens are delivered only once the deadline passes without a cloud token, or the cloud
    fails. An automatic hedge may deliver them earlier where the quality a local answer loses,
    P(local wrong) times `quality_weight_ms`, is worth the tail it cuts.

    When the local engine serves first but is predicted to miss the deadline, the cloud starts
    in parallel at once (the first token wins): a cloud request paid for even when the local
    engine wins. `parallel_cloud = false` forbids that: the cloud then starts only at the
    deadline itself, or when the local engine fails. `parallel_cloud_share`: at most this share
    of this policy's recent requests (`runtime.gather.PARALLEL_WINDOW`, in this client) may start
    the cloud in parallel; past it the cloud waits for the deadline. A hedge (`after_ms`) is the
    policy's own explicit choice and still applies."""

    after_ms: float | Literal["auto"] | None = None
    device_weight: float = Field(default=1.0, ge=0.0)
    cloud_price_ms: float = Field(default=1000.0, ge=0.0)
    # the quality a local answer loses where the cloud was chosen for quality, in ms of p99 TTFT
    # per wrong answer: an automatic hedge may deliver the local answer before the deadline only
    # where P(local wrong) x this is worth the tail it cuts (`routing.hedging`)
    quality_weight_ms: float = Field(default=10_000.0, ge=0.0)
    parallel_cloud: bool = Field(default=True, strict=True)
    parallel_cloud_share: float | None = Field(default=None, ge=0.0, le=1.0)

    _numbers = field_validator(
        "device_weight", "cloud_price_ms", "quality_weight_ms", mode="before"
    )(_number)

    @field_validator("after_ms", mode="before")
    @classmethod
    def _delay(cls, v: object) -> object:
        if v is None or v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ValueError('must be a delay in ms >= 0 (finite), or "auto"')
        return float(v)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.parallel_cloud_share is not None and not self.parallel_cloud:
            raise ValueError(
                "parallel_cloud_share caps parallel cloud starts, but parallel_cloud is false"
            )
        return self


class HandoffTable(_Table):
    """`[handoff]`: the local engine delivers `after_tokens` tokens, then the cloud continues.
    `warm_cloud`: ask the cloud for one token of the prompt at once, so that its prefix cache
    holds the prompt when the continuation comes (the seam is then about a decode step); costs
    a cloud request. It pays where the cloud caches prefixes of this prompt's length: a
    self-hosted vLLM with prefix caching, `hybridllm serve-model`; OpenAI caches prompts of 1024
    tokens or more only."""

    after_tokens: int = Field(default=4, ge=1)
    warm_cloud: bool = Field(default=False, strict=True)
    # the cloud that continues, by name (None: the cloud serving the request's cloud side)
    continuer: EngineChoice | None = None

    _counts = field_validator("after_tokens", mode="before")(_count)


class CascadeTable(_Table):
    """`[cascade]` (runtime/plans/cascade.py): the local engine holds back at most `hold_tokens`
    first tokens, for at most `hold_ms` (counted against the deadline), while the router's stage
    2 reads its confidence; a multiple-choice prompt's option rotations are read after them only
    where they may move the decision and are priced at most `rotations_ms` (the work a local
    answer does not reuse); `hedge`: the cloud starts at once where stage 1 alone would send the
    prompt to the cloud. `judge`, under `complete()` (nothing streamed): "prefix", the held
    tokens as with `stream()`; "answer", the whole local answer is written first and judged."""

    hold_tokens: int = Field(default=8, ge=1, le=64)
    hold_ms: float = Field(default=1500.0, gt=0)
    # the most a multiple-choice prompt's option rotations may add, priced before they start
    # at the pace of the prompt's own prefill (0: never read; they run only where they may
    # move the decision, and inside the hold)
    rotations_ms: float = Field(default=300.0, ge=0)
    hedge: bool = Field(default=False, strict=True)
    judge: Literal["prefix", "answer"] = "prefix"
    # the cloud a judged-out local answer escalates to, by name (None: the cloud serving the
    # request's cloud side)
    escalation: EngineChoice | None = None

    _counts = field_validator("hold_tokens", mode="before")(_count)
    _numbers = field_validator("hold_ms", "rotations_ms", mode="before")(_number)


class SpeculativeTable(_Table):
    """`[speculative]`: `show_drafts` adds `Draft`/`Retract` events to `s.events()`;
    `max_prompt_overhead` caps the prompt tokens its verification rounds bill per committed token
    (past it: plain cloud streaming); `k` fixes the drafts per round (1 to 16; None: k adapts to
    the measured acceptance and round trip; a fixed k skips the pay test); `ahead` drafts the
    next round while this one is verified (off where device and cloud share cores)."""

    show_drafts: bool = Field(default=False, strict=True)
    max_prompt_overhead: float | None = Field(default=None, gt=0)
    k: int | None = Field(default=None, ge=1, le=16)
    ahead: bool = Field(default=True, strict=True)
    # the cloud that verifies the device's drafts, by name (None: the cloud serving the
    # request's cloud side)
    verifier: EngineChoice | None = None

    _counts = field_validator("k", mode="before")(_count)
    _numbers = field_validator("max_prompt_overhead", mode="before")(_number)


class BudgetTable(_Table):
    """`[budget]`: spending caps in US dollars (None: no cap). `per_user_day_usd`,
    `per_user_month_usd`: each end user's spend (the request's `user`, over every policy) under
    its own cap, checked on this policy's requests; a request without a user is not held by
    them. `on_exceeded`: what happens to a request the budget cannot cover: "local" serves it
    on the device, "fail" refuses it."""

    per_request_usd: float | None = Field(default=None, ge=0)
    per_day_usd: float | None = Field(default=None, ge=0)
    per_month_usd: float | None = Field(default=None, ge=0)
    per_user_day_usd: float | None = Field(default=None, ge=0)
    per_user_month_usd: float | None = Field(default=None, ge=0)
    on_exceeded: Literal["local", "fail"] = "local"

    _numbers = field_validator(
        "per_request_usd",
        "per_day_usd",
        "per_month_usd",
        "per_user_day_usd",
        "per_user_month_usd",
        mode="before",
    )(_number)


class LimitsTable(_Table):
    """`[limits]`: `per_user_rpm`, the cloud requests one end user (the request's `user`) may
    send a minute under this policy (None: no limit); past it the request goes local or fails
    as `[budget] on_exceeded` says (`errors.RateLimitedError`). Counted in the budget's ledger,
    so processes and gateways sharing it share the count."""

    per_user_rpm: int | None = Field(default=None, ge=1)


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a request is billed as beside the app: a tenant (a gateway key, `hybridllm keys`),
    by `name`, with its own caps over all its requests (`day_usd`, `month_usd` in US dollars;
    None: no cap). Its end users are its own: a `user` id under two tenants is two users.
    Passed as `stream(..., tenant=Tenant("team-a", day_usd=5.0))`."""

    name: str
    day_usd: float | None = None
    month_usd: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TENANT_NAME.fullmatch(self.name):
            raise InvalidArgumentError(
                "tenant", self.name, "a name of 1 to 64 letters, digits, '.', '_' or '-'"
            )
        for field in ("day_usd", "month_usd"):
            usd = getattr(self, field)
            ok = usd is None or (not isinstance(usd, bool) and isinstance(usd, int | float))
            if not ok or (usd is not None and not usd >= 0):
                raise InvalidArgumentError(field, usd, "a non-negative amount in USD, or None")


_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


PrivacyMode = Literal["off", "keep-local", "block"]
PRIVACY_STRICTNESS: tuple[PrivacyMode, ...] = ("off", "keep-local", "block")


class PrivacyTable(_Table):
    """`[privacy]`: `mode` "keep-local" (the default) keeps a request holding personal or secret
    data off the cloud; "block" refuses it; "off" lets it go. What is looked for: the patterns
    and checksums always (emails, phone numbers, cards, IBANs, national IDs, API keys and
    tokens, private keys: about 0.5 ms a prompt), and the NER layer (names, addresses, dates of
    birth: the `hybridllm[privacy]` extra, loaded in the background when a client opens; a few
    to tens of ms a prompt, off the event loop). `ner` unset (the default): the NER layer runs
    wherever the mode looks at all and the extra is installed (a client says at start when it
    is not: names are then not looked for); `ner = false`: the patterns alone, the explicit way
    out; `ner = true`: the NER layer, warned about where it is not installed."""

    mode: PrivacyMode = "keep-local"
    ner: bool | None = Field(default=None, strict=True)


class ToolsTable(_Table):
    """`[tools]`: what makes a small local model's tool call safe to deliver. Every call is
    checked against its tool's schema (an invalid one is never delivered, and the request
    escalates). `min_call_confidence` (0 to 1; None: every valid call stands): a local call
    whose confidence (its model's own probability of the name's and of the arguments' tokens,
    the lower of the two: `ToolCall.confidence`) is below it goes to the cloud instead, where
    the cloud is the decision's fallback. Calibrate it on labelled tool calls of your own
    (`benchmarks/bench_tools.py --calibrate`): the right bound depends on the model.
    `min_tool_fit` (0 to 1; None: not checked): a local call to a tool whose name's words the
    request states in a share below it (`hybridllm.tools.fit`: "calculate_gcd" for "the greatest
    common divisor of 40 and 50" fits 1.0, "draw_circle" for "the area of a rectangle" 0.0)
    goes to the cloud instead, on the same terms: a small model calls some offered tool even
    where none fits, as sure of it as of a right call. English requests only: a request in
    another language states no English name word, so every local call would go to the cloud."""

    min_call_confidence: float | None = Field(default=None, ge=0, le=1)
    min_tool_fit: float | None = Field(default=None, ge=0, le=1)

    _numbers = field_validator("min_call_confidence", "min_tool_fit", mode="before")(_number)


TABLES: dict[str, type[_Table]] = {
    "sampling": SamplingTable,
    "routing": RoutingTable,
    "hedge": HedgeTable,
    "handoff": HandoffTable,
    "cascade": CascadeTable,
    "speculative": SpeculativeTable,
    "budget": BudgetTable,
    "privacy": PrivacyTable,
    "tools": ToolsTable,
    "limits": LimitsTable,
}

# the old flat fields and their place in the tables: (table, name)
MOVED: dict[str, tuple[str, str]] = {
    **{f: ("sampling", f) for f in ("temperature", "top_p", "stop", "max_tokens")},
    **{f: ("routing", f) for f in _ROUTING_FIELDS},
    "hedge_after_ms": ("hedge", "after_ms"),
    "hedge_device_weight": ("hedge", "device_weight"),
    "hedge_cloud_price_ms": ("hedge", "cloud_price_ms"),
    "parallel_cloud": ("hedge", "parallel_cloud"),
    "parallel_cloud_share": ("hedge", "parallel_cloud_share"),
    "handoff_after_tokens": ("handoff", "after_tokens"),
    "handoff_warm_cloud": ("handoff", "warm_cloud"),
    "cascade_hold_tokens": ("cascade", "hold_tokens"),
    "cascade_hold_ms": ("cascade", "hold_ms"),
    "cascade_hedge": ("cascade", "hedge"),
    "cascade_judge": ("cascade", "judge"),
    "show_drafts": ("speculative", "show_drafts"),
    "max_verify_overhead": ("speculative", "max_prompt_overhead"),
    "speculative_k": ("speculative", "k"),
    "speculative_ahead": ("speculative", "ahead"),
    "privacy": ("privacy", "mode"),
}


def moved_message(flat: str) -> str:
    """Where an old flat field lives now, in words (for the `PolicyError`)."""
    table, name = MOVED[flat]
    return (
        f"{flat!r} is a field of the old flat form: it is now `{name}` in the [{table}] table "
        f"(TOML: [{table}] {name} = ...; Python: Policy({table}={{{name!r}: ...}})); "
        "`hybridllm policy migrate FILE` rewrites an old file"
    )


def _reject_flat(data: Any) -> str | None:
    """The first old flat field in `data` (a privacy mode string counts), or None."""
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        if key in MOVED and not (key == "privacy" and isinstance(value, dict | PrivacyTable)):
            return str(key)
    return None


class Policy(BaseModel):
    """A scenario's settings, in tables (the module docstring lists them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    if not TYPE_CHECKING:  # type checkers keep pydantic's own signature
        __init__ = _init

    name: str = "default"
    description: str = ""
    # the request's class in a busy engine's queue: served by class, then by arrival (waiting
    # ages a request one class up per `BoundedQueue.age_s`); an interactive request preempts a
    # background one decoding on the device (`engines.queue`). Per call: `stream(priority=)`
    priority: Priority = "normal"
    plans: tuple[KnownPlan, ...] = ("single", "hedge")
    # the plan to run when it can (None: the decision picks); `stream(plan=...)` sets it per call
    plan: KnownPlan | None = None
    sampling: SamplingTable = SamplingTable()
    routing: RoutingTable = RoutingTable()
    hedge: HedgeTable = HedgeTable()
    handoff: HandoffTable = HandoffTable()
    cascade: CascadeTable = CascadeTable()
    speculative: SpeculativeTable = SpeculativeTable()
    budget: BudgetTable = BudgetTable()
    privacy: PrivacyTable = PrivacyTable()
    tools: ToolsTable = ToolsTable()
    limits: LimitsTable = LimitsTable()
    # the tables of registered plans (`register_plan_name(table=)`), by plan name: written as
    # top-level tables (`[shout]`, `Policy(shout={...})`), read with `plan_table(name)`
    plan_tables: dict[str, BaseModel] = {}

    @model_validator(mode="before")
    @classmethod
    def _no_flat_fields(cls, data: Any) -> Any:
        flat = _reject_flat(data)
        if flat is not None:
            raise PolicyError(moved_message(flat), field=flat)
        return _with_plan_tables(data)

    @field_serializer("plan_tables")
    def _dump_plan_tables(self, tables: dict[str, BaseModel]) -> dict[str, Any]:
        """Each table by its own model (the field's declared type has no fields)."""
        return {name: table.model_dump() for name, table in tables.items()}

    def plan_table(self, plan: PlanName) -> BaseModel | None:
        """The table of the registered plan `plan` in this policy (its defaults where the
        policy has none); None: that plan declared no table."""
        model = _PLAN_TABLES.get(plan)
        if model is None:
            return None
        return self.plan_tables.get(plan) or model()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.plans:
            raise ValueError("plans: at least one plan must be allowed")
        if "single" not in self.plans:
            raise ValueError("plans: 'single' must be allowed (every other plan falls back to it)")
        if len(set(self.plans)) != len(self.plans):
            raise ValueError("plans: each plan at most once")
        if self.hedge.after_ms is not None and "hedge" not in self.plans:
            raise ValueError("hedge.after_ms is set but 'hedge' is not in plans")
        if self.plan is not None and self.plan not in self.plans:
            raise ValueError(f"plan is {self.plan!r} but it is not in plans")
        return self

    @classmethod
    def preset(cls, name: str, *, dirs: Sequence[str | Path] | None = None) -> Policy:
        """A policy by name: a preset, or a user policy on the policy path (`dirs` first)."""
        return resolve_policy(name, dirs=dirs)

    def with_(self, **changes: Any) -> Policy:
        """This policy with a few fields changed, validated like a file: a table's keys are
        merged into it (`with_(routing={"prefer": "cloud"})` keeps the other routing keys), a
        top-level field is replaced (`with_(name="mine", plans=[...])`)."""
        data = self.model_dump()
        for key, value in changes.items():
            if key in TABLES and isinstance(value, dict):
                data[key] = {**data[key], **value}
            elif key in _PLAN_TABLES and isinstance(value, dict):  # a registered plan's table
                data["plan_tables"][key] = {**data["plan_tables"].get(key, {}), **value}
            else:
                data[key] = value
        return Policy(**data)

    def with_plan(self, plan: str) -> Policy:
        """This policy, running `plan` where it can (a call's `plan=`): added to `plans`; "hedge"
        without a delay hedges "auto". A name that is not a plan is a `PolicyError`."""
        if plan not in plan_names():
            raise PolicyError(
                f"unknown plan {plan!r}; plans: {', '.join(plan_names())}", field="plan"
            )
        plans = self.plans if plan in self.plans else (*self.plans, plan)
        after = self.hedge.after_ms
        if plan == "hedge" and after is None:
            after = "auto"
        return self.with_(plan=plan, plans=plans, hedge={"after_ms": after})

    def under_client(self, privacy: PrivacyMode | None) -> Policy:
        """This policy as a client applies it (the one place the two combine): the client's
        privacy mode is a floor, the stricter of the two wins (None: no floor). (The client's
        budget caps hold beside the policy's in the guard's ledger: every cap must hold.)"""
        strict = PRIVACY_STRICTNESS.index
        if privacy is None or strict(privacy) <= strict(self.privacy.mode):
            return self
        return self.with_(privacy={"mode": privacy})

    @property
    def cloud_allowed(self) -> bool:
        """May any part of a request under this policy reach the cloud?"""
        r = self.routing
        order = r.fallback_order
        return r.allow_cloud and (order is None or any(n != "local" for n in order))

    def plan_cloud(self, plan: str) -> EngineChoice | None:
        """The cloud a plan's table names for its cloud part (the handoff's continuer, the
        cascade's escalation, the speculative verifier); None: the request's cloud."""
        named = {
            "handoff": self.handoff.continuer,
            "cascade": self.cascade.escalation,
            "speculative": self.speculative.verifier,
        }
        return named.get(plan)

    @property
    def order(self) -> tuple[EngineChoice, ...]:
        """The engines that may serve, in order of preference (before routing)."""
        r = self.routing
        if r.fallback_order is not None:
            return r.fallback_order
        return ("cloud", "local") if r.prefer == "cloud" else ("local", "cloud")


def _with_plan_tables(data: Any) -> Any:
    """A policy's data with the registered plans' tables (top-level `[name]` tables, and the
    `plan_tables` of a dumped policy) validated into `plan_tables`; a bad key is a
    `PolicyError` naming it as `name.key`."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    raw = data.pop("plan_tables", None) or {}
    if not isinstance(raw, dict):
        raise PolicyError("must be a table of the registered plans' tables", field="plan_tables")
    given = dict(raw)
    given.update({k: data.pop(k) for k in list(data) if k in _PLAN_TABLES})
    tables: dict[str, BaseModel] = {}
    for name, value in given.items():
        model = _PLAN_TABLES.get(name)
        if model is None:
            raise PolicyError("no registered plan declares this table", field=name)
        try:
            tables[name] = value if isinstance(value, model) else model.model_validate(value)
        except ValidationError as exc:
            msg, loc, close = _described(exc, model)
            raise PolicyError(msg, field=".".join([name, *loc]), suggestion=close) from None
    data["plan_tables"] = tables
    return data


DEFAULT_POLICY = Policy()


# ---- files ------------------------------------------------------------------------------------

ENV_PATH = "HYBRIDLLM_POLICY_PATH"


def policies_dir() -> Path:
    """The presets shipped with hybridllm."""
    here = Path(__file__).resolve().parent
    source = here.parent / "policies"
    return source if source.is_dir() else here / "_data" / "policies"


def search_path(dirs: Sequence[str | Path] | None = None) -> list[Path]:
    """Where policy names are looked up, first match wins: `dirs`, then the directories in
    $HYBRIDLLM_POLICY_PATH (separated by os.pathsep), then the presets."""
    env = [Path(p) for p in os.environ.get(ENV_PATH, "").split(os.pathsep) if p]
    return [*(Path(d) for d in dirs or ()), *env, policies_dir()]


def known_policies(
    directory: Path | None = None, *, dirs: Sequence[str | Path] | None = None
) -> list[str]:
    path = [directory] if directory is not None else search_path(dirs)
    return sorted({p.stem for d in path if d.is_dir() for p in d.glob("*.toml")})


def find_policy(
    name: str, dirs: Sequence[str | Path] | None = None, *, skip: Path | None = None
) -> Path | None:
    """The first `<name>.toml` on the search path (other than `skip`: a file extending the
    preset it shadows gets the next one down)."""
    for d in search_path(dirs):
        candidate = d / f"{name}.toml"
        if candidate.is_file() and (skip is None or candidate.resolve() != skip.resolve()):
            return candidate
    return None


def load_policy_file(path: Path, *, dirs: Sequence[str | Path] | None = None) -> Policy:
    return _load(Path(path), dirs, [])


def _load(path: Path, dirs: Sequence[str | Path] | None, files: list[Path]) -> Policy:
    """Load `path` (and what it extends); every file read is appended to `files`."""
    data, origin = _merged(path, dirs, (), files)
    return policy_from_data(data, path, origin)


def policy_from_data(
    data: dict[str, Any], path: Path, origin: dict[str, Path] | None = None
) -> Policy:
    """A policy from a file's data; a mistake is a `PolicyError` naming the file (`origin`: the
    file that gave each dotted key, where files extend each other) and the field."""
    origin = origin or {}
    flat = _reject_flat(data)
    if flat is not None:
        raise PolicyError(moved_message(flat), path=origin.get(flat, path), field=flat)
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        msg, loc, close = _described(exc, Policy)
        field = ".".join(loc) or None
        where = origin.get(field or "", origin.get(loc[0], path) if loc else path)
        raise PolicyError(msg, path=where, field=field, suggestion=close) from exc


def resolve_policy(
    policy: str | Path | Policy | None,
    *,
    dirs: Sequence[str | Path] | None = None,
    files: list[Path] | None = None,
) -> Policy:
    """A Policy object, a policy name (looked up on the search path), or a path to a TOML file.
    `files`, if given, receives every file read."""
    if policy is None:
        return DEFAULT_POLICY
    if isinstance(policy, Policy):
        return policy
    read = files if files is not None else []
    path = Path(policy)
    if path.suffix == ".toml" or path.is_file():
        return _load(path, dirs, read)
    found = find_policy(str(policy), dirs)
    if found is None:
        known = ", ".join(known_policies(dirs=dirs)) or "(none)"
        raise PolicyError(f"unknown policy {str(policy)!r}; known policies: {known}")
    return _load(found, dirs, read)


class PolicyCache:
    """Resolved policies by name or path, re-read when one of their files changes (a new file
    that would shadow a cached name is not looked for)."""

    def __init__(self, dirs: Sequence[str | Path] | None = None) -> None:
        self.dirs = list(dirs or ())
        self._cache: dict[str, tuple[Policy, tuple[tuple[Path, int], ...]]] = {}

    def get(self, policy: str | Path | Policy | None) -> Policy:
        if policy is None or isinstance(policy, Policy):
            return resolve_policy(policy)
        key = str(policy)
        hit = self._cache.get(key)
        if hit is not None and all(_mtime(p) == m for p, m in hit[1]):
            return hit[0]
        files: list[Path] = []
        resolved = resolve_policy(policy, dirs=self.dirs, files=files)
        self._cache[key] = (resolved, tuple((p, _mtime(p)) for p in files))
        return resolved


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyError("policy file not found", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"not valid TOML: {exc}", path=path) from exc


def _merged(
    path: Path, dirs: Sequence[str | Path] | None, chain: tuple[Path, ...], files: list[Path]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """The file's data on top of what it extends, and which file gave each (dotted) key."""
    files.append(path)
    data = _read(path)
    own_name = data.get("name", path.stem)
    parent_ref = data.pop("extends", None)
    base: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    if parent_ref is not None:
        if not isinstance(parent_ref, str) or not parent_ref:
            raise PolicyError("must be a policy name or a .toml path", path=path, field="extends")
        parent = _parent_file(path, parent_ref, dirs)
        chain = (*chain, path)
        if parent.resolve() in {p.resolve() for p in chain}:
            loop = " -> ".join(p.name for p in (*chain, parent))
            raise PolicyError(f"extends cycle: {loop}", path=path, field="extends")
        base, origin = _merged(parent, dirs, chain, files)
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
            origin.update({f"{key}.{k}": path for k in value})
        else:
            base[key] = value
            origin.update({f"{key}.{k}": path for k in value} if isinstance(value, dict) else {})
        origin[key] = path
    base["name"] = own_name
    return base, origin


def _parent_file(path: Path, ref: str, dirs: Sequence[str | Path] | None) -> Path:
    if ref.endswith(".toml"):
        parent = (path.parent / ref) if not Path(ref).is_absolute() else Path(ref)
        if not parent.is_file():
            raise PolicyError(f"no such file: {parent}", path=path, field="extends")
        return parent
    near = [path.parent, *(dirs or ())]  # a sibling file first, then the search path
    found = find_policy(ref, near, skip=path)
    if found is None:
        known = ", ".join(n for n in known_policies(dirs=near) if n != path.stem) or "(none)"
        raise PolicyError(
            f"unknown policy {ref!r}; known policies: {known}", path=path, field="extends"
        )
    return found
