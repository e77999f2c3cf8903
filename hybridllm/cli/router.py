"""Handlers of `hybridllm router ...` (parsers live in hybridllm/cli.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hybridllm.routing.labels import Label
from hybridllm.training.train import Form


def _quiet_threads() -> None:
    # OpenMP / BLAS worker threads only contend on problems this small (seen: several times
    # slower on a busy 2-core machine); read when scikit-learn's native libraries load, so this
    # runs before importing it (BLAS threads are also limited around the fits: training.train).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def default_data() -> Path:
    """`data/router/labels.jsonl` of the source checkout."""
    return Path(__file__).resolve().parents[2] / "data" / "router" / "labels.jsonl"


def cmd_train(args: argparse.Namespace) -> int:
    _quiet_threads()
    from hybridllm.routing.artifact import default_dir
    from hybridllm.training.train import train

    out = Path(args.out) if args.out else default_dir()
    data = Path(args.data) if args.data else default_data()
    from_log = args.from_log or None  # a path or URL: decision_log_from_url
    signals = _signals_path(args, data)
    train(data, out, from_log=from_log, label=args.label, form=args.form, seed=args.seed,
          signals=signals)  # fmt: skip
    return 0


def _signals_path(args: argparse.Namespace, data: Path) -> Path | None:
    """--signals, else `local_signals.jsonl` beside the labels when it exists; 'none': no."""
    given = getattr(args, "signals", None)
    if given == "none":
        return None
    if given:
        return Path(given)
    path = data.parent / "local_signals.jsonl"
    return path if path.is_file() else None


def cmd_eval_stage2(args: argparse.Namespace, data: Path) -> int:
    from hybridllm.training import cv
    from hybridllm.training.data import load_examples, load_signals, load_whole_inputs

    path = _signals_path(args, data)
    if path is None:
        print("no local signals (run scripts/label_local_signals.py)", file=sys.stderr)
        return 2
    load = load_whole_inputs if getattr(args, "whole", False) else load_signals
    d = cv.Data.build(load_examples(data), load(path))
    cv.cross_validate(d)
    cv.leave_sources_out(d)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    _quiet_threads()
    from hybridllm.routing.artifact import default_dir
    from hybridllm.routing.router import Router
    from hybridllm.training.data import load_examples
    from hybridllm.training.evaluate import (
        evaluate,
        format_report,
        format_sources,
        plot,
        quality_table,
        report_json,
    )

    if args.stage2:
        return cmd_eval_stage2(args, Path(args.data) if args.data else default_data())
    router_dir = Path(args.router) if args.router else default_dir()
    router = Router.load(router_dir)
    examples = load_examples(Path(args.data) if args.data else default_data())
    sources = sorted({ex.source for ex in examples})
    leave_out = sources if args.leave_out == "all" else [
        s for s in args.leave_out.split(",") if s
    ]  # fmt: skip
    compare: list[tuple[Label, Form]] = []
    if not args.no_compare:
        if router.label == "cloud-needed":
            other: Form = "single" if router.form == "factored" else "factored"
            compare = [("cloud-needed", other), ("local-wrong", "single")]
        else:
            compare = [("cloud-needed", "factored")]
    blocks = evaluate(router, examples, leave_out=leave_out, compare=compare)
    print(f"router: {router_dir} (label {router.label}, form {router.form}, "
          f"data sha256 {str(router.manifest.get('data', {}).get('sha256'))[:12]})")  # fmt: skip
    print("\nquality vs cloud share, test split:")
    print(quality_table(blocks[0]))
    print()
    print(format_report(blocks))
    print(format_sources(blocks))
    plot_path = Path(args.plot) if args.plot else router_dir / "eval.png"
    plot(blocks, plot_path)
    print(f"plot: {plot_path}")
    if args.json:
        Path(args.json).write_text(json.dumps(report_json(blocks), indent=1) + "\n")
        print(f"json: {args.json}")
    return 0


def cmd_recalibrate(args: argparse.Namespace) -> int:
    from hybridllm.routing.logs import decision_log_from_url
    from hybridllm.routing.router import Router
    from hybridllm.training.save import save_recalibrated

    router = Router.load(Path(args.router) if args.router else None)
    log = decision_log_from_url(args.from_log, argument="--from-log")
    try:
        scores = log.scores(policy=args.policy)
    finally:
        log.close()
    new = router.recalibrate(scores)
    out = save_recalibrated(new, Path(args.out))
    for share in (0.2, 0.5, 0.8):
        print(
            f"cloud share {share:.0%}: threshold {router.threshold(cloud_share=share):.4f} "
            f"-> {new.threshold(cloud_share=share):.4f}"
        )
    print(f"recalibrated on {len(scores)} logged scores -> {out}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from hybridllm.routing.router import Router

    router = Router.load(Path(args.router) if args.router else None)
    text = args.prompt if args.prompt is not None else sys.stdin.read()
    score = router.score(text)
    print(f"score {score:.4f}  (P(the cloud is needed), label {router.manifest.get('label')})")
    for share in (0.2, 0.5, 0.8):
        t = router.threshold(cloud_share=share)
        print(f"cloud share {share:.0%}: threshold {t:.4f} -> {'cloud' if score > t else 'local'}")
    return 0
