"""Labeller, local side only: the local model's own signals on every labelled prompt.

For each row of the labels file (`data/router/labels.jsonl`), runs the LOCAL model
(qwen2.5-coder-0.5b-instruct, the chat formatting the labels and the engine use) through
`hybridllm.engines.llama.signals.session_measure`, the same code the SDK runs at request time,
and appends {"source", "id", "signals", "prompt_tokens", "ms"} to a side file keyed by source and
id. The correctness labels are not touched. Resumable: ids already in the output are skipped.

    OMP_WAIT_POLICY=PASSIVE nice -n 19 .venv/bin/python scripts/label_local_signals.py \\
        --threads 1 [--limit 20]

`--whole` reads each labelled local answer that is not a single option letter (the free-form
kinds: short, yesno, number, gsm8k, code) back through the model, the prompt and the answer as
one prefill, and writes the whole answer's figures (`answer_figures.ANSWER_NAMES` and the
log-probability summary over all its tokens, as the cascade's "answer" judge computes them) to
`data/router/answer_signals.jsonl`; `head_lp_mean` is the first eight tokens' mean, to check
against the side file's `lp_mean` (the same greedy answer, read again). Resumable.

`--redo KIND` measures the rows of one kind of prompt again (after the signals gained figures,
e.g. `--redo mc` for the option rotations), resumable through `OUT.redo`; when all are done it
rewrites OUT in place, and every other row gets the new figures' names as null (not measured:
they do not apply to it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MODEL = "qwen2.5-coder-0.5b-instruct"


def round_robin(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """One row of each source in turn, so that a run stopped early covers every source."""
    by: dict[object, list[dict[str, object]]] = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r)
    out: list[dict[str, object]] = []
    while any(by.values()):
        for group in by.values():
            if group:
                out.append(group.pop(0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=Path("data/router/labels.jsonl"))
    ap.add_argument("--out", type=Path, default=Path("data/router/local_signals.jsonl"))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--redo", metavar="KIND", help="measure the rows of this kind again")
    ap.add_argument("--whole", action="store_true", help="the whole answers' figures")
    args = ap.parse_args()
    if args.whole:
        out = args.out if args.out != ap.get_default("out") else Path(WHOLE_OUT)
        whole(args.src, out, args.threads, args.limit)
        return

    from hybridllm.engines.llama.session import LlamaSession
    from hybridllm.engines.llama.signals import session_measure
    from hybridllm.local.resolve import resolve_model
    from hybridllm.local.settings import DEFAULT_SETTINGS

    rows = [json.loads(x) for x in args.src.read_text().splitlines() if x.strip()]
    out = args.out.with_name(args.out.name + ".redo") if args.redo else args.out
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["source"], r["id"]))
    todo = [r for r in rows if (r["source"], r["id"]) not in done]
    if args.redo:
        kinds = sorted({str(r.get("kind")) for r in rows})
        if args.redo not in kinds:
            ap.error(
                f"--redo {args.redo!r}: no row of that kind in {args.src} ({', '.join(kinds)})"
            )
        todo = [r for r in todo if r.get("kind") == args.redo]
    todo = round_robin(todo)[: args.limit]
    settings = DEFAULT_SETTINGS.replace(n_threads=args.threads, n_threads_batch=args.threads)
    session = LlamaSession(resolve_model(MODEL), n_ctx=2048, settings=settings, extra={})
    t0 = time.time()
    cpu0 = time.process_time()
    with out.open("a") as fh:
        for n, row in enumerate(todo, 1):
            t = time.perf_counter()
            detail: dict[str, object] = {}
            signals, prompt_tokens, answer, _ = session_measure(
                session, [{"role": "user", "content": row["prompt"]}], detail=detail
            )
            ms = (time.perf_counter() - t) * 1000
            rec = {
                "source": row["source"],
                "id": row["id"],
                "model": MODEL,
                "signals": {k: (None if v != v else round(v, 6)) for k, v in signals.items()},
                "prompt_tokens": prompt_tokens,
                "answer_head": session.llm.detokenize(answer).decode("utf-8", "replace"),
                "options": detail.get("options"),
                "rotated": detail.get("rotated") or None,
                "ms": round(ms, 1),
            }
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            if n % 50 == 0 or n == len(todo):
                wall = time.time() - t0
                print(
                    f"{n}/{len(todo)} rows, {wall:.0f} s wall, "
                    f"{time.process_time() - cpu0:.0f} s CPU, {n / wall * 60:.0f}/min",
                    file=sys.stderr,
                    flush=True,
                )

    if args.redo and len(done) + len(todo) >= sum(r.get("kind") == args.redo for r in rows):
        merge(args.out, out)


WHOLE_OUT = "data/router/answer_signals.jsonl"
CAPS = {"short": 24, "yesno": 4, "number": 12, "gsm8k": 512, "code": 384}  # the labels' max_tokens


def whole(src: Path, out: Path, threads: int, limit: int | None) -> None:
    """`--whole`: the figures of every free-form labelled local answer, read back through the
    model (teacher forcing: the stored answer is the greedy one that was judged)."""
    import numpy as np

    from hybridllm.engines.llama import signals as sig
    from hybridllm.engines.llama.session import LlamaSession
    from hybridllm.local.resolve import resolve_model
    from hybridllm.local.settings import DEFAULT_SETTINGS
    from hybridllm.routing.answer_figures import whole_figures

    rows = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    unknown = sorted({str(r["kind"]) for r in rows} - set(CAPS) - {"mc"})
    if unknown:
        raise SystemExit(f"{src}: no max_tokens known for kind {', '.join(unknown)}")
    done = set()
    if out.exists():
        done = {(r["source"], r["id"]) for r in map(json.loads, out.read_text().splitlines())}
    todo = [r for r in rows if r["kind"] in CAPS and (r["source"], r["id"]) not in done]
    todo = round_robin(todo)[:limit]
    todo.sort(key=lambda r: r["kind"] not in ("gsm8k", "code"))  # where the head says least
    settings = DEFAULT_SETTINGS.replace(n_threads=threads, n_threads_batch=threads)
    session = LlamaSession(
        resolve_model(MODEL), n_ctx=2048, settings=settings, extra={"logits_all": True}
    )
    llm, lc, vocab = session.llm, session._lc, session._vocab
    t0 = time.time()
    with out.open("a") as fh:
        for n, row in enumerate(todo, 1):
            t = time.perf_counter()
            local = row["local"]
            prompt = session.tokenize(session.render([{"role": "user", "content": row["prompt"]}]))
            answer = llm.tokenize(local["response"].encode(), add_bos=False, special=False)
            ended = int(local["completion_tokens"]) < CAPS[row["kind"]]
            llm.reset()
            llm.eval(prompt + answer)
            scores = np.asarray(llm.scores[: len(prompt) + len(answer)])
            dists = [
                sig.distribution(scores[len(prompt) - 1 + i], tok) for i, tok in enumerate(answer)
            ]
            tokens = list(answer)
            if ended:  # the end of generation the model chose (or the EOS it would have had)
                last = scores[len(prompt) + len(answer) - 1]
                eog = int(np.argmax(last))
                if not lc.llama_vocab_is_eog(vocab, eog):
                    eog = int(llm.token_eos())
                dists.append(sig.distribution(last, eog))
                tokens.append(eog)
            values = sig.summarise(dists, None)
            values.update(whole_figures(tokens, [d.logprob for d in dists], ended))
            head = np.array([d.logprob for d in dists[: sig.N_ANSWER]])
            rec = {
                "source": row["source"],
                "id": row["id"],
                "model": MODEL,
                "signals": {k: (None if v != v else round(v, 6)) for k, v in values.items()},
                "head_lp_mean": round(float(head.mean()), 6) if head.size else None,
                "ms": round((time.perf_counter() - t) * 1000, 1),
            }
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            if n % 50 == 0 or n == len(todo):
                print(
                    f"{n}/{len(todo)} rows, {time.time() - t0:.0f} s", file=sys.stderr, flush=True
                )


def merge(path: Path, redo: Path) -> None:
    """Rewrite `path` with the rows of `redo` in their places, every row with the same names."""
    from hybridllm.engines.llama.signals import SIGNAL_NAMES

    new = {(r["source"], r["id"]): r for r in map(json.loads, redo.read_text().splitlines())}
    lines = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        r = new.get((r["source"], r["id"]), r)
        r["signals"] = {k: r["signals"].get(k) for k in SIGNAL_NAMES}
        lines.append(json.dumps(r))
    path.write_text("\n".join(lines) + "\n")
    redo.unlink()
    print(f"{path}: {len(new)} rows measured again, {len(lines)} rows in all", file=sys.stderr)


if __name__ == "__main__":
    main()
