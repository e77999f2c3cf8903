"""The grammar's cost per token on the local engine (issue 26): decode a JSON answer with and
without a llama.cpp grammar, same model, same run, interleaved.

    python benchmarks/bench_grammar.py [--model NAME] [--rounds N] [--tokens N] [--json PATH]

Arms, each a greedy answer to the same prompt (which asks for JSON), decoded through
`LlamaSession` (the engine's synchronous side, so no event-loop time is counted):
- plain: no grammar (the model writes what it likes);
- json_schema: the answer under the grammar of a response format's schema;
- json_object: under the grammar of any JSON object;
- tool call: `tool_choice` naming a tool (the call's JSON under the call grammar; the checked
  ways open the call with the prompt, the whole way writes its opening itself, as before);
- banned: `tool_choice="none"` (the `<tool_call>` token banned by a logits processor).
Each grammar arm runs twice: "checked" (the engine's way, `grammar.CheckedGrammar`: the tokens
the sampler can keep are checked first, the whole vocabulary only when none passes) and "whole"
(llama.cpp's grammar sampler over the whole vocabulary at every step, as before issue 45); the
table says whether the two wrote the same text (greedy: they must).
With llguidance installed (`pip install llguidance`; not a dependency of the package), a third
way runs each grammar arm: "llguidance", its token mask over the whole vocabulary at every step
(`benchmarks/_llguidance.py`, the same GBNF converted by llguidance). Its greedy answer may
differ from the other two where the grammar forces text: llguidance then allows only the
tokenizer's own split of it (`"employees"` as one token where the model ranked `"employee"`
first). The grammars' compile times are printed beside: llama.cpp's grammar sampler built from
the GBNF, llguidance's matcher (its tokenizer over the vocabulary is built once, timed apart).
ms/token = the decode steps' total time / their count, the first step (which evaluates the
prompt's last token) left out; up to --tokens steps per answer. Medians over the rounds, and
each arm's ratio to plain. No timed assertions.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks._llguidance import LLGuidanceGrammar, tokenizer
from benchmarks._report import cpu_model, report
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.llama.session import LlamaSession
from hybridllm.engines.llama.toolcalls import call_opening
from hybridllm.local.resolve import resolve_model
from hybridllm.local.settings import DEFAULT_SETTINGS
from hybridllm.tools import tool_spec

PROMPT = (
    "Describe three employees of a small bakery as JSON: for each, the name, the age, the role "
    "and a short list of the skills they have."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "employees": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "role": {"type": "string", "enum": ["baker", "cashier", "manager"]},
                    "skills": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "age", "role", "skills"],
            },
        }
    },
    "required": ["employees"],
}
TOOL = {
    "type": "function",
    "function": {"name": "add_employees", "parameters": SCHEMA},
}
ARMS: dict[str, Any] = {
    "plain": None,
    "json_schema": tool_spec(
        None, None, {"type": "json_schema", "json_schema": {"name": "staff", "schema": SCHEMA}}
    ),
    "json_object": tool_spec(None, None, {"type": "json_object"}),
    "tool call": tool_spec(
        [TOOL], {"type": "function", "function": {"name": TOOL["function"]["name"]}}, None
    ),
    "banned": tool_spec([TOOL], "none", None),
}


GRAMMAR_ARMS = ("json_schema", "json_object", "tool call")


class Session(LlamaSession):
    """The engine's session with its grammar processor swapped for llguidance's where
    `llguidance` is set (the benchmark's third way; `_checked` is where the session makes it)."""

    llguidance: Any = None  # llguidance's tokenizer, while the llguidance way runs

    def _checked(self, grammar: str, temperature: float, start: int) -> Any:
        if self.llguidance is None:
            return super()._checked(grammar, temperature, start)
        return LLGuidanceGrammar(self.llguidance, grammar, way="mask", start=start)


def runs(ways: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(arm, way) for arm in ARMS for way in (ways if arm in GRAMMAR_ARMS else ("checked",))]


def label(arm: str, check: str) -> str:
    return f"{arm} ({check})" if arm in GRAMMAR_ARMS else arm


def decode(
    session: Session, arm: str, check: str, tokens: int, llg: Any = None
) -> tuple[int, float, list[int]]:
    """Decode one answer; return (timed steps, seconds they took, the tokens written)."""
    session.grammar_check = "whole" if check == "whole" else "checked"
    session.llguidance = llg if check == "llguidance" else None
    request = GenerationRequest(
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=tokens + 1,
        temperature=0.0,
        tools=ARMS[arm],
    )
    gen = session.prefill(session.prepare(request))
    session.step(gen)  # the prompt's last token, then the first sample: not a decode step
    steps, spent = 0, 0.0
    while gen.finish_reason is None and steps < tokens:
        t0 = time.perf_counter()
        out = session.step(gen)
        spent += time.perf_counter() - t0
        steps += 1
        if out is None:
            break
    written = list(gen.tokens_out)
    session.close(gen)
    return steps, spent, written


def compile_ms(session: Session, llg: Any, rounds: int) -> dict[str, dict[str, float]]:
    """Median ms to build each grammar arm's checker: llama.cpp's sampler, llguidance's matcher."""
    out: dict[str, dict[str, float]] = {}
    for arm in GRAMMAR_ARMS:
        request = GenerationRequest(messages=[{"role": "user", "content": PROMPT}], tools=ARMS[arm])
        plan = session.prepare(request).tools
        assert plan is not None
        grammar = plan.call_grammar if arm == "tool call" else plan.answer_grammar
        assert grammar is not None
        makers: dict[str, Any] = {"llama.cpp": lambda g=grammar: session._checked(g, 0.0, 0)}
        if llg is not None:
            makers["llguidance"] = lambda g=grammar: LLGuidanceGrammar(llg, g, way="mask", start=0)
        out[arm] = {}
        for name, make in makers.items():
            spent = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                make()
                spent.append(1000 * (time.perf_counter() - t0))
            out[arm][name] = statistics.median(spent)
    return out


def llguidance_tokenizer(session: Session) -> tuple[Any, float | None]:
    """llguidance's tokenizer for the session's vocabulary and the seconds it took; None where
    llguidance is not installed."""
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return None, None
    t0 = time.perf_counter()
    return tokenizer(session._lc, session._vocab), time.perf_counter() - t0


def same_start(a: str, b: str) -> bool:
    """The same text as far as both went (an answer cut at --tokens steps, or a named call the
    prompt opened, which then ends sooner than one that wrote its opening within the steps)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def run(model: str, rounds: int, tokens: int) -> dict[str, Any]:
    path = resolve_model(model)
    session = Session(path, n_ctx=2048, settings=DEFAULT_SETTINGS.resolved(), extra={})
    session.warm_up()
    llg, llg_s = llguidance_tokenizer(session)
    ways = ("checked", "whole") + (("llguidance",) if llg is not None else ())
    plan = runs(ways)
    names = [label(arm, check) for arm, check in plan]
    per: dict[str, list[float]] = {name: [] for name in names}
    counts: dict[str, list[int]] = {name: [] for name in names}
    texts: dict[str, str] = {}
    for _ in range(rounds):
        for (arm, check), name in zip(plan, names, strict=True):  # interleaved: every arm a round
            steps, spent, written = decode(session, arm, check, tokens, llg)
            per[name].append(1000 * spent / max(steps, 1))
            counts[name].append(steps)
            texts[name] = session.llm.detokenize(written).decode(errors="replace")
    compiled = compile_ms(session, llg, max(rounds, 5))
    called = label("tool call", "whole")  # the model wrote the opening the others were given
    texts[called] = texts[called].removeprefix(call_opening(TOOL["function"]["name"]))
    session.unload()
    ms = {name: statistics.median(v) for name, v in per.items()}
    same = {
        label(arm, way): same_start(texts[label(arm, way)], texts[label(arm, "whole")])
        for arm in GRAMMAR_ARMS
        for way in ways
        if way != "whole"
    }
    return {
        "cpu": cpu_model(),
        "model": model,
        "rounds": rounds,
        "tokens": tokens,
        "ms_per_token": ms,
        "ratio_to_plain": {name: ms[name] / ms["plain"] for name in names},
        "same_as_whole": same,
        "compile_ms": compiled,
        "llguidance_tokenizer_s": llg_s,
        "steps": counts,
        "samples_ms": per,
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"grammar cost per token: {res['model']}, {res['rounds']} rounds, <= {res['tokens']} "
        f"steps per answer, CPU {res['cpu']}",
        f"{'arm':<26} {'ms/token':>9} {'x plain':>8}  same text as whole  steps",
    ]
    for arm, ms in res["ms_per_token"].items():
        ratio = res["ratio_to_plain"][arm]
        same = {True: "yes", False: "NO"}.get(res.get("same_as_whole", {}).get(arm), "")
        lines.append(f"{arm:<26} {ms:>9.1f} {ratio:>8.2f}  {same:<20}  {res['steps'][arm]}")
    compiled = "; ".join(
        f"{arm}: " + ", ".join(f"{k} {v:.2f}" for k, v in by.items())
        for arm, by in res["compile_ms"].items()
    )
    lines.append(f"grammar compile, median ms: {compiled}")
    if res["llguidance_tokenizer_s"] is not None:
        lines.append(f"llguidance's tokenizer, built once: {res['llguidance_tokenizer_s']:.2f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report(run(args.model, args.rounds, args.tokens), render, args.json)


if __name__ == "__main__":
    main()
