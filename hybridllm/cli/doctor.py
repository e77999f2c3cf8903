"""`hybridllm doctor`: one screen on whether this machine runs hybridllm well, and what to do.

Each check returns a `Finding`: ok, warn (works, but slower or riskier than it could) or fail
(something will not work), with the facts and the command that mends it. The exit code is 1
when any check fails, else 0, so scripts and CI can run it.
"""

from __future__ import annotations

import json
import os
import platform
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TextIO

from hybridllm.engines.base import Engine
from hybridllm.guard.privacy_ner import INSTALL, NerLayer, NerStatus
from hybridllm.local import cpubuild, models, tune, variants, waitpolicy

Status = Literal["ok", "warn", "fail"]
MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
CLOUD_TIMEOUT_S = 3.0
REBUILD = "rebuild for this CPU: rm -f .venv/.llama-build-key && ./dev setup"


@dataclass(frozen=True)
class Finding:
    title: str
    status: Status
    facts: tuple[str, ...] = ()
    fix: str = ""


@dataclass
class Doctor:
    """The checks, with what they read from outside injectable for tests."""

    cpuinfo: str = ""
    machine: str = field(default_factory=platform.machine)
    system_info: Callable[[], str] | None = None
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None  # the model the endpoint must list (None: $OPENAI_MODEL, if set)
    # a running cloud engine (a client's `client.cloud`): its own state is reported too (a key
    # it found missing or refused stops it until `set_api_key()`)
    engine: Engine | None = None
    # the privacy scan's NER layer: loads it and says what it found (injectable for tests)
    privacy_layer: Callable[[], NerStatus] | None = None

    def build(self) -> Finding:
        flags = cpubuild.cpu_flags(self.cpuinfo or _read("/proc/cpuinfo"))
        want = [cpubuild.FEATURE_OF[o] for o in cpubuild.enabled(flags)]
        try:
            info = (self.system_info or _llama_system_info)()
        except Exception as exc:  # a build that cannot load is the finding
            return Finding("llama.cpp build", "fail", (f"llama_cpp does not load: {exc}",), REBUILD)
        built = [f for f in cpubuild.FEATURE_OF.values() if f in cpubuild.built_features(info)]
        facts = (
            f"CPU ({self.machine}) offers: {', '.join(want) or 'none of the named sets'}",
            f"the build has: {', '.join(built)}",
        )
        if self.machine.lower() not in cpubuild.X86:
            return Finding("llama.cpp build", "ok", (*facts, "native build (not x86)"))
        lacking = cpubuild.missing(flags, info)
        if lacking:
            lacks = f"lacks what the CPU offers: {', '.join(lacking)}"
            return Finding("llama.cpp build", "warn", (*facts, lacks), REBUILD)
        return Finding("llama.cpp build", "ok", facts)

    def wait_policy(self) -> Finding:
        choice = waitpolicy.choose_safely()  # what a process that loads llama.cpp now would use
        if choice.policy == "active":
            facts = (choice.why, "active waiting keeps a core at 100% while idle")
            fix = f"unset {waitpolicy.ENV} (hybridllm then spins only briefly)"
            return Finding("OpenMP wait policy", "warn", facts, fix)
        return Finding("OpenMP wait policy", "ok", (choice.why,))

    def models(self) -> Finding:
        facts, problems = [], []
        for m in models.list_manifests():
            path = models.cached_path(m)
            if not path.exists():
                facts.append(f"{m.name}: not pulled")
                continue
            good = models.is_present(m, verify=True)  # trusts the .sha256 marker if unchanged
            facts.append(f"{m.name}: {'verified' if good else 'WRONG SIZE OR HASH'} ({path})")
            if not good:
                problems.append(m.name)
            for quant in variants.QUANTS:
                if variants.is_made(m, quant):
                    facts.append(f"{m.name}:{quant}: made here ({variants.variant_path(m, quant)})")
        if problems:
            return Finding(
                "models",
                "fail",
                tuple(facts),
                f"pull again: hybridllm models pull {' '.join(problems)}",
            )
        return Finding("models", "ok", tuple(facts) or ("no model manifests",))

    def tuning(self) -> Finding:
        facts, stale = [], []
        for m in models.list_manifests():
            path = models.cached_path(m)
            if not path.exists():
                continue
            stored = tune.read_tuning(path)
            if stored is None:
                facts.append(f"{m.name}: not tuned (defaults are used)")
            elif tune.load_tuning(path) is None:
                facts.append(f"{m.name}: tuned on another build, CPU or model file: ignored")
                stale.append(m.name)
            else:
                rates = f"prefill {stored.prefill_tps:.0f}, decode {stored.decode_tps:.1f} tok/s"
                facts.append(f"{m.name}: tuned, {rates} ({stored.measured_at})")
        if stale:
            return Finding("tuning", "warn", tuple(facts), f"tune again: hybridllm tune {stale[0]}")
        return Finding("tuning", "ok", tuple(facts) or ("no pulled models",))

    def cloud(self) -> Finding:
        stopped = None if self.engine is None else self.engine.info().unavailable
        if stopped is not None:
            return Finding(
                "cloud endpoint",
                "fail",
                (f"the engine sends nothing: {stopped}",),
                "give it a working key: engine.set_api_key(...)",
            )
        url = self.base_url or os.environ.get("OPENAI_BASE_URL")
        if not url:
            return Finding(
                "cloud endpoint", "ok", ("none configured (OPENAI_BASE_URL unset): local only",)
            )
        key = self.api_key or os.environ.get("OPENAI_API_KEY")
        req = urllib.request.Request(url.rstrip("/") + "/models")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        facts = [
            f"{url} (API key {'set' if key else 'NOT set'})",
            "verifier dialects: probed by the first speculative request",
        ]
        no_key = "set OPENAI_API_KEY (any value for a server that needs none)"
        try:
            with urllib.request.urlopen(req, timeout=CLOUD_TIMEOUT_S) as resp:  # noqa: S310
                names = [m.get("id", "?") for m in json.load(resp).get("data", [])]
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):  # OpenAIEngine stops sending after such an answer
                why = "no key was sent" if not key else "the API key was refused"
                return Finding(
                    "cloud endpoint",
                    "fail",
                    (*facts, f"answered HTTP {exc.code}: {why}"),
                    "check OPENAI_API_KEY" if key else no_key,
                )
            return Finding(
                "cloud endpoint",
                "fail",
                (*facts, f"answered HTTP {exc.code}"),
                "check the endpoint",
            )
        except (OSError, ValueError) as exc:
            return Finding(
                "cloud endpoint",
                "fail",
                (*facts, f"unreachable: {exc}"),
                "check OPENAI_BASE_URL and the network",
            )
        facts.insert(1, f"reachable; models: {', '.join(names[:5]) or 'none listed'}")
        model = self.model or os.environ.get("OPENAI_MODEL")
        if model and names and model not in names:
            facts.append(f"the model {model!r} is NOT listed: requests for it would fail")
            return Finding("cloud endpoint", "fail", tuple(facts), "check OPENAI_MODEL")
        if not key:  # reachable, but the SDK sends no placeholder key: nothing would be sent
            facts.append("OpenAIEngine sends nothing without an API key: requests stay local")
            return Finding("cloud endpoint", "fail", tuple(facts), no_key)
        facts.append(_continuation(url, key, model))
        return Finding("cloud endpoint", "ok", tuple(facts))

    def privacy(self) -> Finding:
        try:
            status = (self.privacy_layer or _load_ner)()
        except Exception as exc:  # an installed layer that does not load is the finding
            return Finding(
                "privacy scan",
                "fail",
                (f"the NER layer does not load: {exc}",),
                f"reinstall: {INSTALL}",
            )
        if not status.available:
            lost = "person names, addresses, dates of birth, ID numbers are NOT detected"
            facts = (status.describe(), lost)
            return Finding("privacy scan", "warn", facts, INSTALL)
        return Finding("privacy scan", "ok", (status.describe(),))

    def run(self) -> list[Finding]:
        policy = self.wait_policy()  # before the build check loads llama.cpp and applies one
        checks = [self.build(), policy, self.models(), self.tuning(), self.cloud()]
        return [*checks, self.privacy()]


def report(findings: Iterable[Finding], out: TextIO) -> int:
    worst = 0
    for f in findings:
        out.write(f"[{MARK[f.status]}] {f.title}\n")
        for fact in f.facts:
            out.write(f"       {fact}\n")
        if f.fix:
            out.write(f"       -> {f.fix}\n")
        worst = max(worst, {"ok": 0, "warn": 0, "fail": 1}[f.status])
    return worst


def _continuation(url: str, key: str, model: str | None) -> str:
    """How the endpoint continues a started answer: the dialect `OpenAIEngine`'s probe finds
    (a few tokens of a fixed count; `engines.continuation`)."""
    import anyio

    from hybridllm.engines.openai_engine import OpenAIEngine

    engine = OpenAIEngine(base_url=url, api_key=key, model=model, timeout=CLOUD_TIMEOUT_S)

    async def probe() -> str | None:
        try:
            return await engine.probe_continuation()
        finally:
            await engine.aclose()

    found = anyio.run(probe)
    if found is None:
        return "continuations: not probed (the endpoint did not answer the probe)"
    return f"continuations: the {found} dialect (a handoff or failover goes on in it)"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def _load_ner() -> NerStatus:
    layer = NerLayer()
    if layer.available:
        layer.load()
    return layer.status()


def _llama_system_info() -> str:
    from hybridllm.local import loader

    info: bytes = loader.llama_cpp().llama_print_system_info()
    return info.decode("utf-8", "replace")
