"""The client's engines by the app's own names, and how a policy's names bind to them.

`HybridClient(engines={"local": LlamaCppEngine(), "fast": OpenAIEngine(...), "smart": ...})`
holds its engines in a `Roster`: by name, in the order given, with the one engine that runs on
the device (`EngineInfo.on_device`; at most one) and the clouds. `local=` and `cloud=` are the
shorthand for `engines={"local": ..., "cloud": ...}`.

Routing decides between two sides, the device ("local") and the cloud ("cloud"): the router's
score, the deadlines, the privacy scan and the budget ask "may this leave the device, and is it
worth it". Which cloud serves the cloud side is this module's: a policy names engines
(`[routing] prefer = "smart"`, `fallback_order = ["smart", "fast", "local"]`; "local" and
"cloud" stay the names of the two sides, "cloud" meaning every cloud in the client's order),
`bind()` turns those names into the sides `decide()` reads, and `names()` into the order in
which the clouds are tried: the first one that can serve now (its circuit closed, available)
serves the cloud side, and the others are the next ones a plan turns to when it fails, before
the device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import Literal

from hybridllm.engines import validate
from hybridllm.engines.base import Engine
from hybridllm.errors import ConfigError, InvalidArgumentError, PolicyError
from hybridllm.events import EngineName
from hybridllm.policy import Policy
from hybridllm.routing.decision import CloudConsidered

__all__ = ["SIDES", "Roster", "Side"]

Side = Literal["local", "cloud"]
SIDES: tuple[Side, ...] = ("local", "cloud")


@dataclass(frozen=True)
class Roster:
    """The engines by name (in the app's order), the one on the device, the clouds."""

    engines: Mapping[EngineName, Engine]
    device: EngineName | None
    clouds: tuple[EngineName, ...]

    @classmethod
    def of(
        cls,
        engines: Mapping[EngineName, Engine],
        device: EngineName | None | EllipsisType = ...,
    ) -> Roster:
        """The roster of `engines` (checked: `Engine`s under names a policy can use, at most
        one on the device, "local" naming only the device's and "cloud" only a cloud).
        `device`: the device's engine by name (`local=`, None: none); by default, the one whose
        `EngineInfo.on_device` says so."""
        if not isinstance(engines, Mapping) or not engines:
            raise InvalidArgumentError("engines", engines, "a non-empty {name: Engine} mapping")
        found: list[EngineName] = []
        for name, engine in engines.items():
            validate.engine_name("engines", name)
            if not isinstance(engine, Engine):
                raise InvalidArgumentError(
                    f"engines[{name!r}]", engine, "an Engine (e.g. LlamaCppEngine())"
                )
            if device is ... and engine.info().on_device:
                found.append(name)
        if device is not ...:
            found = [] if device is None else [device]
        return cls._checked(engines, found)

    @classmethod
    def _checked(cls, engines: Mapping[EngineName, Engine], device: list[EngineName]) -> Roster:
        if len(device) > 1:
            raise ConfigError(
                f"engines: {', '.join(device)} all run on the device; a client holds at most one"
            )
        clouds = tuple(n for n in engines if n not in device)
        for word, side in (("local", "cloud"), ("cloud", "local")):
            if word in engines and (word in clouds) == (side == "cloud"):
                raise ConfigError(
                    f"engines: {word!r} names the {word} side in policies; the engine under it "
                    f"runs {'in the cloud' if side == 'cloud' else 'on the device'}: name it "
                    "otherwise"
                )
        return cls(dict(engines), device[0] if device else None, clouds)

    def side(self, name: EngineName) -> Side:
        return "local" if name == self.device else "cloud"

    def by_side(
        self, engines: Mapping[EngineName, Engine], cloud: EngineName | None
    ) -> dict[EngineName, Engine]:
        """`engines` (this roster's, by name; the clouds perhaps behind their guards) as
        routing sees them: the device's as "local", `cloud` (None: none) as "cloud"."""
        sides: dict[EngineName, Engine] = {}
        if self.device is not None:
            sides["local"] = engines[self.device]
        if cloud is not None:
            sides["cloud"] = engines[cloud]
        return sides

    # ---- a policy's names ---------------------------------------------------------------------

    def check(self, policy: Policy) -> None:
        """A policy that names an engine this client does not hold is a `PolicyError` naming
        it (the side words "local" and "cloud" and "auto" are always understood)."""
        r = policy.routing
        named = [("routing.prefer", r.prefer)] + [
            (f"routing.{key}[{i}]", n)
            for key, names in (("fallback_order", r.fallback_order), ("tiers", r.tiers))
            for i, n in enumerate(names or ())
        ]
        for field, name in named:
            if name not in (*SIDES, "auto") and name not in self.engines:
                held = ", ".join(self.engines)
                raise PolicyError(
                    f"policy {policy.name!r} names engine {name!r}, which this client does not "
                    f"hold (it holds: {held})",
                    field=field,
                )
        self._check_plan_clouds(policy)
        for i, name in enumerate(r.tiers or ()):
            if i and name != "cloud" and self.side(name) == "local":
                raise PolicyError(
                    f"policy {policy.name!r}: tiers name the device's engine {name!r} after a "
                    "cloud; the device can only be the first, easiest tier",
                    field=f"routing.tiers[{i}]",
                )

    def _check_plan_clouds(self, policy: Policy) -> None:
        """A plan's table naming its cloud (`Policy.plan_cloud`) names one of this client's."""
        tables = (("handoff", "continuer"), ("cascade", "escalation"), ("speculative", "verifier"))
        for plan, key in tables:
            named = policy.plan_cloud(plan)
            if named is None or named == "cloud" or named in self.clouds:
                continue
            raise PolicyError(
                f"policy {policy.name!r}: [{plan}] {key} = {named!r} must be one of this "
                f"client's clouds ({', '.join(self.clouds) or 'none'})",
                field=f"{plan}.{key}",
            )

    def bind(self, policy: Policy) -> Policy:
        """`policy` with its engine names as the sides `decide()` reads (the same policy where
        it names none)."""
        self.check(policy)
        r = policy.routing
        words = (r.prefer, *(r.fallback_order or ()), *(r.tiers or ()))
        if all(n in (*SIDES, "auto") for n in words):
            return policy
        prefer = r.prefer if r.prefer in (*SIDES, "auto") else self.side(r.prefer)
        routing: dict[str, object] = {"prefer": prefer}
        if r.tiers is not None:  # the device's engine by its side; the clouds by name
            routing["tiers"] = tuple("local" if self.side(n) == "local" else n for n in r.tiers)
        if r.fallback_order is not None:
            sides = [n if n in SIDES else self.side(n) for n in r.fallback_order]
            routing["fallback_order"] = tuple(dict.fromkeys(sides))
        return policy.with_(routing=routing)

    def names(self, policy: Policy) -> tuple[EngineName, ...]:
        """The engines the policy allows, by name, in its order ("local": the device's engine,
        "cloud": the clouds not named before it, in the client's order; without a
        `fallback_order`, the preferred engine first, then its side, then the other side)."""
        r = policy.routing
        words: list[EngineName]
        if r.fallback_order is not None:
            words = list(r.fallback_order)
        else:
            first = r.prefer if r.prefer != "auto" else "local"
            side = first if first in SIDES else self.side(first)
            words = [first, side, "cloud" if side == "local" else "local"]
        if not r.allow_cloud:
            words = [w for w in words if w != "cloud" and (w in SIDES or self.side(w) == "local")]
        named = {w for w in words if w not in SIDES}  # named on their own: placed there
        out: list[EngineName] = []
        for word in words:
            if word == "local":
                out += [] if self.device is None else [self.device]
            elif word == "cloud":
                out += [c for c in self.clouds if c not in named]
            elif word in self.engines:
                out.append(word)
        return tuple(dict.fromkeys(out))

    def cloud_order(self, policy: Policy) -> tuple[EngineName, ...]:
        """The clouds the policy allows, in the order they are tried (under tiers: the tiers'
        clouds from the easiest step up, then the others)."""
        order = tuple(n for n in self.names(policy) if n in self.clouds)
        tiers = policy.routing.tiers
        if tiers is None:
            return order
        first = next(n for n in tiers if n == "cloud" or n in self.clouds)
        return self.tiered(order, tiers, first)

    def tiered(
        self, order: tuple[EngineName, ...], tiers: tuple[EngineName, ...], tier: EngineName
    ) -> tuple[EngineName, ...]:
        """`order` (the clouds allowed) as a request of `tier` tries them: that tier's cloud
        first, then the tiers above it (harder requests' engines), then the ones below it
        (nearest first), then the clouds no tier names ("cloud": every cloud not named)."""
        if tier == "local" or tier not in tiers:
            return order
        at = tiers.index(tier)
        ranked = (*tiers[at:], *reversed(tiers[:at]))
        named = set(tiers)
        out: list[EngineName] = []
        for word in ranked:
            if word == "cloud":
                out += [c for c in order if c not in named]
            elif word in order:
                out.append(word)
        return tuple(dict.fromkeys((*out, *order)))

    def pick_cloud(
        self, order: tuple[EngineName, ...], usable: Callable[[EngineName], bool]
    ) -> EngineName | None:
        """The cloud that serves the cloud side: the first in `order` that can serve now, else
        the first (routing then says why it cannot); None: no cloud allowed."""
        for name in order:
            if usable(name):
                return name
        return order[0] if order else None

    def considered(
        self,
        order: tuple[EngineName, ...],
        chosen: EngineName | None,
        circuit_open: Callable[[EngineName], bool],
        unavailable: Callable[[EngineName], bool],
    ) -> tuple[CloudConsidered, ...]:
        """Each cloud in `order` as weighed for one request: `chosen` (it serves the cloud side;
        routing says why, if it cannot now), else passed over for its open circuit or for being
        unavailable, else the next ones a failure turns to."""
        out = []
        for name in order:
            passed: Literal["circuit_open", "unavailable"] | None = None
            if name != chosen and circuit_open(name):
                passed = "circuit_open"
            elif name != chosen and unavailable(name):
                passed = "unavailable"
            out.append(CloudConsidered(name, name == chosen, passed))
        return tuple(out)
