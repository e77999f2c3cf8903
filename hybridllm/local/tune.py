"""`hybridllm tune`: measure llama.cpp settings on this device and keep the fastest.

A tuning is stored beside the model as `<model file>.tune.json`: the chosen `LlamaSettings`, the
measured prefill and decode rates, and what they were measured with (llama-cpp-python version and
build, CPU flags and core count, the model's sha256). `load_tuning()` ignores a file whose
measurement no longer applies, so a rebuilt library, another CPU or a changed model falls back to
the defaults until `hybridllm tune` runs again. `LlamaCppEngine` loads it when it starts.

The search is short and bounded: threads for decode and for prompt batches (changed on the
loaded context), then flash attention, the micro-batch size (128 and 512 against the current
one) and the KV cache type, one after the other (each a new context on the same memory-mapped
file). A candidate replaces the current choice only when it is faster by more than `MIN_GAIN`,
so noise keeps the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridllm.errors import ModelNotFoundError, TuneError
from hybridllm.local import hub, loader, models
from hybridllm.local.fingerprint import cpu_fingerprint, file_stamp, llama_build, sha256_file
from hybridllm.local.settings import DEFAULT_SETTINGS, LlamaSettings, cpu_threads

FORMAT = 1
MIN_GAIN = 0.03
Progress = Callable[[str, int, int], None]
"""progress(what is being measured, steps done, steps in all)."""


# ---- the stored tuning ----------------------------------------------------------------------


@dataclass(frozen=True)
class Rates:
    prefill_tps: float  # prompt tokens per second
    decode_tps: float  # generated tokens per second

    @property
    def tpot_s(self) -> float:
        return 1.0 / self.decode_tps if self.decode_tps > 0 else float("inf")


@dataclass(frozen=True)
class Trial:
    """One measured candidate, for `hybridllm tune --show`."""

    label: str
    prefill_tps: float | None = None
    decode_tps: float | None = None


@dataclass(frozen=True)
class Environment:
    """What a measurement depends on besides the settings."""

    llama_cpp: str  # version and a fingerprint of the native libraries
    cpu: str  # fingerprint of the CPU flags and the usable core count
    model_sha256: str
    model_stamp: str  # size and mtime: lets a load skip re-hashing an unchanged file

    @classmethod
    def current(cls, model_path: Path, *, known_sha256: str | None = None) -> Environment:
        stamp = file_stamp(model_path)
        return cls(llama_build(), cpu_fingerprint(), known_sha256 or sha256_file(model_path), stamp)

    def matches(self, model_path: Path) -> bool:
        """Same library, CPU and model (re-hashes the model only if its size or mtime moved)."""
        if self.llama_cpp != llama_build() or self.cpu != cpu_fingerprint():
            return False
        try:
            if file_stamp(model_path) == self.model_stamp:
                return True
            return sha256_file(model_path) == self.model_sha256
        except OSError:
            return False


@dataclass(frozen=True)
class Tuning:
    settings: LlamaSettings
    rates: Rates
    environment: Environment
    trials: tuple[Trial, ...] = ()
    measured_at: str = ""
    seconds: float = 0.0  # how long the search took

    @property
    def prefill_tps(self) -> float:
        return self.rates.prefill_tps

    @property
    def decode_tps(self) -> float:
        return self.rates.decode_tps

    def to_json(self) -> str:
        data = {
            "format": FORMAT,
            "settings": self.settings.to_dict(),
            "prefill_tps": round(self.rates.prefill_tps, 2),
            "decode_tps": round(self.rates.decode_tps, 2),
            "environment": dataclasses.asdict(self.environment),
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "measured_at": self.measured_at,
            "seconds": round(self.seconds, 1),
        }
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Tuning:
        """Parse a stored tuning; raises ValueError (or TypeError/KeyError) if malformed."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("unknown tuning format")
        return cls(
            settings=LlamaSettings.from_dict(data["settings"]),
            rates=Rates(float(data["prefill_tps"]), float(data["decode_tps"])),
            environment=Environment(**data["environment"]),
            trials=tuple(Trial(**t) for t in data.get("trials", [])),
            measured_at=str(data.get("measured_at", "")),
            seconds=float(data.get("seconds", 0.0)),
        )


def tuning_path(model_path: Path | str) -> Path:
    """Beside the model; for a model in the hub's cache (a snapshot's link to a blob), in
    hybridllm's cache under the blob's name (huggingface_hub's cache holds its own files only)."""
    path = Path(model_path)
    if hub.in_hub_cache(path):
        return models.cache_dir() / "tuning" / (path.resolve().name + ".tune.json")
    return path.with_name(path.name + ".tune.json")


def save_tuning(model_path: Path | str, tuning: Tuning) -> Path:
    """Write the tuning beside the model (atomically); return its path."""
    dest = tuning_path(model_path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_text(tuning.to_json(), encoding="utf-8")
    os.replace(tmp, dest)
    return dest


def read_tuning(model_path: Path | str) -> Tuning | None:
    """The stored tuning whether or not it still applies (None: missing or unreadable)."""
    try:
        return Tuning.from_json(tuning_path(model_path).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def load_tuning(model_path: Path | str) -> Tuning | None:
    """The stored tuning if it was measured with this library, CPU and model; else None."""
    tuning = read_tuning(model_path)
    if tuning is None or not tuning.environment.matches(Path(model_path)):
        return None
    return tuning


# ---- measuring ------------------------------------------------------------------------------


def measure_prefill(llm: Any, tokens: list[int]) -> float:
    """Tokens per second for evaluating `tokens` from an empty KV cache."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    t0 = time.perf_counter()
    llm.eval(tokens)
    return len(tokens) / max(time.perf_counter() - t0, 1e-9)


def measure_decode(llm: Any, context: list[int], n: int) -> float:
    """Tokens per second for `n` one-token steps after `context` (median step)."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    llm.eval(context)
    tok = context[-1]
    steps = []
    for _ in range(n):
        t = time.perf_counter()
        llm.eval([tok])
        steps.append(time.perf_counter() - t)
    return 1.0 / max(statistics.median(steps), 1e-9)


def bench_tokens(llm: Any, n: int) -> list[int]:
    """A deterministic `n`-token prompt of ordinary code-and-prose text."""
    text = (
        "def moving_average(values, window):\n"
        '    """Average of each window of consecutive values."""\n'
        "    out = []\n    for i in range(len(values) - window + 1):\n"
        "        out.append(sum(values[i:i + window]) / window)\n    return out\n\n"
        "The quick brown fox jumps over the lazy dog while the committee reviews the budget. "
    )
    ids: list[int] = []
    while len(ids) < n:
        ids.extend(llm.tokenize(text.encode(), add_bos=False, special=False))
    return ids[:n]


# ---- the search -----------------------------------------------------------------------------


@dataclass
class SettingsSearch:
    model_path: Path
    n_ctx: int
    prompt_tokens: int
    decode_tokens: int
    reps: int
    progress: Progress | None
    steps: int
    done: int = 0
    trials: list[Trial] = field(default_factory=list)

    def tick(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(what, min(self.done, self.steps), self.steps)

    def load(self, settings: LlamaSettings) -> Any:
        llama_cpp = loader.llama_cpp()
        try:
            return llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=self.n_ctx,
                verbose=False,
                **settings.llama_kwargs(),
            )
        except (ValueError, RuntimeError) as exc:
            msg = f"llama.cpp cannot load the model with {settings} ({exc})"
            raise TuneError(msg, path=self.model_path) from exc

    def rates(self, llm: Any, label: str, *, prefill: bool = True, decode: bool = True) -> Rates:
        prompt = bench_tokens(llm, self.prompt_tokens)
        pre: list[float] = []
        dec: list[float] = []
        for _ in range(self.reps):
            if prefill:
                pre.append(measure_prefill(llm, prompt))
            if decode:
                dec.append(measure_decode(llm, prompt[:32], self.decode_tokens))
        rates = Rates(
            statistics.median(pre) if pre else 0.0, statistics.median(dec) if dec else 0.0
        )
        self.trials.append(Trial(label, rates.prefill_tps or None, rates.decode_tps or None))
        self.tick(label)
        return rates


def _thread_candidates(n: int) -> list[int]:
    return sorted({n, max(1, n - 1), max(1, n // 2)}, reverse=True)


def _better(new: float, old: float) -> bool:
    return new > old * (1.0 + MIN_GAIN)


def tune_model(
    model_path: Path | str,
    *,
    base: LlamaSettings = DEFAULT_SETTINGS,
    n_ctx: int = 2048,
    quick: bool = False,
    progress: Progress | None = None,
) -> Tuning:
    """Measure candidate settings for the model on this device; return the fastest found.

    Bounded: about a dozen short measurements (a 256-token prompt and 24 decode steps each,
    `quick`: 128 and 12, once); roughly 30-60 s for a 0.5B model on two cores. Runs on the
    calling thread, which should be the one that drives llama.cpp (see `engines/llama/thread.py`).
    """
    path = Path(model_path)
    if not path.is_file():
        raise ModelNotFoundError("model file does not exist", path=path)
    threads = _thread_candidates(cpu_threads())
    started = time.perf_counter()
    search = SettingsSearch(
        path,
        n_ctx=n_ctx,
        prompt_tokens=128 if quick else 256,
        decode_tokens=12 if quick else 24,
        reps=1 if quick else 2,
        progress=progress,
        steps=len(threads) + 5,
    )
    if progress is not None:
        progress("loading", 0, search.steps)
    best = base.resolved()
    llm = search.load(best)
    try:
        search.rates(llm, "warm-up", decode=False)  # page the weights in; not compared
        best, rates = _tune_threads(search, llm, best, threads)
    finally:
        llm.close()
    # settings that need a new context, one after the other
    others = [u for u in (128, 512) if u != best.n_ubatch]
    changes: list[dict[str, Any]] = [{"flash_attn": not best.flash_attn}]
    changes += [{"n_ubatch": u} for u in others]
    for change in [*changes, {"kv_type": "q8_0" if best.kv_type == "f16" else "f16"}]:
        cand = best.replace(**change)
        if cand == best:
            search.tick("skip")
            continue
        llm = search.load(cand)
        try:
            got = search.rates(llm, _label(change))
        finally:
            llm.close()
        if _better(got.prefill_tps, rates.prefill_tps) and got.decode_tps >= rates.decode_tps * (
            1 - MIN_GAIN
        ):
            best, rates = cand, got
    return Tuning(
        settings=best,
        rates=rates,
        environment=Environment.current(path),
        trials=tuple(search.trials),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        seconds=time.perf_counter() - started,
    )


def _tune_threads(
    search: SettingsSearch, llm: Any, best: LlamaSettings, threads: list[int]
) -> tuple[LlamaSettings, Rates]:
    llama_cpp = loader.llama_cpp()
    dec: dict[int, float] = {}
    pre: dict[int, float] = {}
    for n in threads:
        llama_cpp.llama_set_n_threads(llm.ctx, n, n)
        r = search.rates(llm, f"threads={n}")
        dec[n], pre[n] = r.decode_tps, r.prefill_tps
    n_dec = _pick(dec, threads[0])
    n_pre = _pick(pre, threads[0])
    best = best.replace(n_threads=n_dec, n_threads_batch=n_pre)
    return best, Rates(pre[n_pre], dec[n_dec])


def _pick(scores: dict[int, float], default: int) -> int:
    top = max(scores, key=lambda k: scores[k])
    return top if _better(scores[top], scores[default]) else default


def _label(change: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in change.items())


def describe(tuning: Tuning) -> Iterator[str]:
    """Lines for `hybridllm tune --show`."""
    s = tuning.settings
    yield (
        f"settings: n_threads={s.n_threads} n_threads_batch={s.n_threads_batch} "
        f"n_batch={s.n_batch} n_ubatch={s.n_ubatch} flash_attn={s.flash_attn} "
        f"kv_type={s.kv_type} use_mmap={s.use_mmap} use_mlock={s.use_mlock}"
    )
    yield f"prefill: {tuning.prefill_tps:.1f} tokens/s   decode: {tuning.decode_tps:.1f} tokens/s"
    env = tuning.environment
    yield f"measured: {tuning.measured_at} in {tuning.seconds:.0f} s (llama-cpp {env.llama_cpp})"
    if tuning.trials:
        yield "trials:"
        for t in tuning.trials:
            pre = f"{t.prefill_tps:8.1f}" if t.prefill_tps else "       -"
            dec = f"{t.decode_tps:8.1f}" if t.decode_tps else "       -"
            yield f"  {t.label:<24} prefill {pre} tok/s  decode {dec} tok/s"
