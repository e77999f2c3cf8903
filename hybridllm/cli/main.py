"""The `hybridllm` command.

Each command group lives in a `_register_<group>(subparsers)` function that adds its parsers and
sets `func=<handler>` on each; a handler takes the parsed arguments and returns an exit code.
`build_parser()` calls the registrars in `_REGISTRARS`. To add a command group (demo, chat,
bench, router), write its registrar and handlers and append it there.

Exit codes: 0 ok, 1 command-specific failure, 2 a hybridllm error or bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hybridllm.cli.args import (
    engine_name,
    existing_dir,
    non_negative_int,
    positive_int,
    prompt,
)
from hybridllm.errors import HybridError

Handler = Callable[[argparse.Namespace], int]
Subparsers = Any  # argparse._SubParsersAction[argparse.ArgumentParser] (a private type)


# --- models ---------------------------------------------------------------------------------


def _format_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _pypi_source(packages: tuple[str, ...]) -> str:
    more = f" +{len(packages) - 1}" if len(packages) > 1 else ""
    return f"pypi {packages[0]}{more}"


def cmd_models_list(args: argparse.Namespace) -> int:
    from hybridllm.cli.progress import render_table
    from hybridllm.local import hub, models, variants

    rows: list[tuple[str, ...]] = []
    for m in models.list_manifests():
        present = models.is_present(m, verify=args.verify)
        rows.append(
            (m.name, m.role, _format_size(m.size_bytes), "yes" if present else "no",
             _pypi_source(m.source.packages), str(models.cached_path(m)))
        )  # fmt: skip
        for quant in variants.QUANTS:  # variants made here are listed, unmade ones are not
            if variants.is_made(m, quant):
                path = variants.variant_path(m, quant)
                size = _format_size(path.stat().st_size)
                rows.append(
                    (
                        f"{m.name}:{quant}",
                        m.role,
                        size,
                        "yes",
                        f"made here from {m.name}",
                        str(path),
                    )
                )
    for c in hub.list_cached():  # every GGUF in the hub cache (hf://, `models pull`)
        source = "hub " + (os.environ.get("HF_ENDPOINT") or "huggingface.co")
        rows.append((c.ref, "local", _format_size(c.size), "yes", source, str(c.path)))
    head = ("NAME", "ROLE", "SIZE", "PRESENT", "SOURCE", "PATH")
    print(render_table(head, rows, numeric_from=99))
    return 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    from hybridllm.cli.progress import ProgressBar
    from hybridllm.local import hub, models, resolve, variants

    for name in args.names:
        if hub.is_hub_ref(name):
            _pull_from_hub(name, quiet=args.quiet)
            continue
        base, quant = variants.split(name)  # "name:quant": requantized here from its base
        manifest = models.get_manifest(base)
        if quant is None:
            done, state = models.is_present(manifest, verify=True), "present"
        else:
            done, state = variants.is_made(manifest, quant), "made"
        if done and not args.force:
            print(f"{name}: already {state}", file=sys.stderr)
            print(resolve.resolve_model(name))
            continue
        fetch = models.pull if quant is None else variants.make
        bar = ProgressBar(name) if not args.quiet else None
        try:
            path = fetch(name, progress=bar, force=args.force)
        finally:
            if bar is not None:
                bar.close()
        print(path)
    return 0


def _pull_from_hub(ref: str, *, quiet: bool) -> None:
    """A model on the Hugging Face hub into its cache: resumed where a pull broke off,
    checked against the hub's sha256; its path printed."""
    from hybridllm.cli.progress import ProgressBar
    from hybridllm.local import hub

    bar = ProgressBar(ref) if not quiet else None
    try:
        path = hub.fetch(ref, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    print(path)


def cmd_models_fit(args: argparse.Namespace) -> int:
    """What the model needs at `--n-ctx` against the free memory (exit 1: it does not fit)."""
    from hybridllm.local import fit, models, resolve

    path = resolve.resolve_model(args.name)
    n_ctx = args.n_ctx or models.default_n_ctx(args.name)
    est = fit.estimate(path, n_ctx)
    gib = 1 << 30
    print(
        f"{args.name} at n_ctx {n_ctx}: weights {est.weights_bytes / gib:.2f} GiB, "
        f"KV cache {est.kv_bytes / gib:.2f} GiB, buffers {est.compute_bytes / gib:.2f} GiB, "
        f"need {est.need_bytes / gib:.2f} GiB"
    )
    free = "unknown" if est.available_bytes is None else f"{est.available_bytes / gib:.2f} GiB"
    print(f"free: {free}; {'fits' if est.fits else 'does NOT fit'}")
    return 0 if est.fits else 1


def cmd_models_path(args: argparse.Namespace) -> int:
    from hybridllm.local import resolve

    print(resolve.resolve_model(args.name))
    return 0


def _register_models(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("models", help="list, pull and locate local GGUF models")
    sub = group.add_subparsers(dest="models_command", metavar="COMMAND", required=True)

    p = sub.add_parser("list", help="list the known models and whether they are pulled")
    p.add_argument("--verify", action="store_true", help="check sha256 (slow the first time)")
    p.set_defaults(func=cmd_models_list)

    p = sub.add_parser(
        "pull",
        help="fetch and assemble models into the cache; NAME:QUANT (q4_0, iq4_nl, q8_0) "
        "requantizes the pulled NAME here; hf://OWNER/REPO/FILE.gguf or hf://OWNER/REPO:QUANT "
        "downloads from the Hugging Face hub",
    )
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument("--force", action="store_true", help="pull again even if present")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_models_pull)

    p = sub.add_parser(
        "fit", help="estimate a model's memory at a context size against the free memory"
    )
    p.add_argument("name", metavar="NAME", help="a manifest name, a GGUF path or hf://...")
    p.add_argument("--n-ctx", type=positive_int, default=None, metavar="N", help="context size")
    p.set_defaults(func=cmd_models_fit)

    p = sub.add_parser("path", help="print the cached file of a pulled model")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_models_path)


# --- demo -----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from hybridllm.cli.demo import (
        run_demo,  # heavy imports (engines, anyio) only when the demo runs
    )

    return run_demo(args)


def _register_demo(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="a tour of what hybridllm does, live, through the local model and a cloud",
        description=(
            "With a cloud: a tour, each request streamed with its route reason and figures: the "
            "router on a mix of prompts, a fallback on a stalled cloud, a handoff, a cascade "
            "kept local and one escalated, speculative drafting (drafts and retractions "
            "painted), an interactive request overtaking a background one, a tool call, a "
            "privacy refusal; then a table. --quick and --no-cloud run the policies' scenarios "
            "instead. Without OPENAI_BASE_URL / OPENAI_API_KEY (or --base-url / --api-key) a "
            "stand-in cloud (Qwen2.5-Coder-1.5B) is started on 127.0.0.1."
        ),
    )
    p.add_argument("--quick", action="store_true", help="fewer and shorter requests")
    p.add_argument("--no-cloud", action="store_true", help="local engine only")
    p.add_argument("--local-model", metavar="NAME", help="local model name or GGUF path")
    p.add_argument(
        "--standin-model",
        metavar="NAME",
        help="the stand-in cloud's model (default: qwen2.5-coder-1.5b-instruct)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="CPU threads for each model (default: all)",
    )
    p.add_argument("--base-url", metavar="URL", help="OpenAI-compatible endpoint for the cloud")
    p.add_argument("--api-key", metavar="KEY", help="API key for the cloud endpoint")
    p.add_argument("--model", metavar="NAME", help="cloud model name")
    p.set_defaults(func=cmd_demo)


# --- explain --------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from hybridllm.cli.explain import run_explain

    return run_explain(args)


def _register_explain(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "explain",
        help="print where a prompt would go under a policy, and why (nothing is sent)",
        description=(
            "Run the client's routing decision for PROMPT under a policy and print the plan, the "
            "engines and the reasons. Offline: the live state is what the options say, the "
            "router is the shipped one (or --router, --router-score, --threshold), latency "
            "comes from the latency model's priors (or the local engine's warm-up with "
            "--local-model)."
        ),
    )
    p.add_argument("prompt", type=prompt, metavar="PROMPT")
    p.add_argument("--policy", default="chat", metavar="NAME", help="preset, user policy or file")
    p.add_argument(
        "--policy-dir", type=existing_dir, action="append", metavar="DIR",
        help="look up policies here first (must exist)",
    )  # fmt: skip
    p.add_argument("--max-tokens", type=int, metavar="N", help="output tokens (policy default)")
    p.add_argument("--queue-s", type=float, default=0.0, metavar="S", help="local queue wait")
    p.add_argument("--cloud-circuit", choices=["closed", "open"], default="closed")
    named = {"action": "append", "type": engine_name, "metavar": "NAME"}
    p.add_argument("--cloud", help="a cloud by name, repeatable (default: 'cloud')", **named)
    p.add_argument("--open-circuit", help="this engine's circuit is open (repeatable)", **named)
    p.add_argument("--router-score", type=float, metavar="P", help="P(local answer wrong)")
    p.add_argument("--threshold", type=float, metavar="T", help="router threshold to use")
    p.add_argument("--router", type=Path, metavar="DIR", help="router artifact (default: shipped)")
    p.add_argument("--no-router", action="store_true", help="decide without a router")
    p.add_argument("--found", action="append", metavar="KIND", help="a privacy finding kind")
    p.add_argument("--budget-exhausted", action="store_true", help="the budget cannot pay")
    p.add_argument("--no-local", action="store_true", help="no local engine")
    p.add_argument("--no-cloud", action="store_true", help="no cloud engine")
    p.add_argument("--local-model", metavar="NAME", help="load it for warm-up figures")
    p.add_argument(
        "--threads", type=positive_int, metavar="N", help="CPU threads for --local-model"
    )
    p.add_argument(
        "--answer",
        choices=["text", "tools", "json"],
        default="text",
        help="the answer may call tools, or must be JSON (delivered whole: fewer plans run)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_explain)


# --- router ---------------------------------------------------------------------------------


def cmd_router(args: argparse.Namespace) -> int:
    from hybridllm.cli import router as commands  # scikit-learn loads only for these commands

    handler: Handler = getattr(commands, f"cmd_{args.router_command}")
    return handler(args)


def _register_router(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("router", help="train, evaluate and try the prompt router")
    sub = group.add_subparsers(dest="router_command", metavar="COMMAND", required=True)

    p = sub.add_parser("train", help="train the router from labelled data (deterministic)")
    p.add_argument("--data", metavar="PATH", help="labels.jsonl (default: data/router/)")
    p.add_argument("--out", metavar="DIR", help="artifact directory (default: models/router/)")
    p.add_argument(
        "--from-log",
        metavar="URL",
        help="also learn from a decision log's feedback (a path, sqlite://PATH or redis://...)",
    )
    p.add_argument("--label", choices=["cloud-needed", "local-wrong"], default="cloud-needed",
                   help="what the score predicts (default: cloud-needed)")  # fmt: skip
    p.add_argument("--form", choices=["factored", "single"], default=None,
                   help="two heads, P(cloud right) * (1 - P(local right)), or one head on the "
                   "label (default: factored for cloud-needed)")  # fmt: skip
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--signals", metavar="PATH",
                   help="the local model's signals per row: also train stage 2 "
                   "(default: data/router/local_signals.jsonl if present; 'none': no)")  # fmt: skip
    p.set_defaults(func=cmd_router)

    p = sub.add_parser("eval", help="PGR / APGR / CPT on the test split, with baselines and a plot")
    p.add_argument("--data", metavar="PATH", help="labels.jsonl (default: data/router/)")
    p.add_argument("--router", metavar="DIR", help="artifact directory (default: models/router/)")
    p.add_argument("--leave-out", default="gsm8k,triviaqa", metavar="SOURCES",
                   help="comma-separated sources to hold out of training, or 'all'")  # fmt: skip
    p.add_argument("--plot", metavar="PNG", help="plot path (default: <router dir>/eval.png)")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--no-compare", action="store_true", help="skip the other routers")
    p.add_argument("--signals", metavar="PATH", help="local signals (default: data/router/)")
    p.add_argument("--stage2", action="store_true",
                   help="cross-validate stage 1, the local signals alone and the combination, "
                   "per source and with sources left out")  # fmt: skip
    p.add_argument("--whole", action="store_true",
                   help="with --stage2: judge free-form prompts by the whole local answer, "
                   "as cascade_judge = 'answer' does (answer_signals.jsonl beside "
                   "the signals)")  # fmt: skip
    p.set_defaults(func=cmd_router)

    p = sub.add_parser(
        "recalibrate", help="cloud-share thresholds from the scores of your own logged traffic"
    )
    p.add_argument(
        "--from-log",
        required=True,
        metavar="URL",
        help="the decision log: a path, sqlite://PATH or redis://HOST:PORT/DB[?prefix=NAME]",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where to write the new artifact")
    p.add_argument("--router", metavar="DIR", help="artifact directory (default: models/router/)")
    p.add_argument("--policy", metavar="NAME", help="only this policy's requests")
    p.set_defaults(func=cmd_router)

    p = sub.add_parser("score", help="score one prompt (argument or stdin)")
    p.add_argument("prompt", nargs="?", help="the prompt text (default: read stdin)")
    p.add_argument("--router", metavar="DIR", help="artifact directory (default: models/router/)")
    p.set_defaults(func=cmd_router)


# --- tune -----------------------------------------------------------------------------------


def cmd_tune(args: argparse.Namespace) -> int:
    from hybridllm.cli.progress import StepBar
    from hybridllm.local import resolve, tune  # tune loads llama.cpp only when measuring

    path = resolve.resolve_model(args.model)
    if args.show:
        stored = tune.read_tuning(path)
        if stored is None:
            print(f"{args.model}: not tuned; run `hybridllm tune {args.model}`", file=sys.stderr)
            return 1
        if not stored.environment.matches(path):
            print(
                f"{args.model}: the stored tuning is stale (another llama-cpp-python build, CPU "
                "or model file) and is ignored; run `hybridllm tune` again",
                file=sys.stderr,
            )
        print(f"{tune.tuning_path(path)}")
        for line in tune.describe(stored):
            print(line)
        _show_wait_policy()
        return 0
    bar = StepBar(f"tuning {path.name}") if not args.quiet else None
    try:
        result = tune.tune_model(path, n_ctx=args.n_ctx, quick=args.quick, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    result = _tune_wait_policy(tune, path, result, args)
    saved = tune.save_tuning(path, result)
    print(saved)
    for line in tune.describe(result):
        print(line)
    return 0


def _show_wait_policy() -> None:
    from hybridllm.local import waitpolicy

    choice = waitpolicy.choose_safely()
    print(f"OpenMP wait setting for a new process: {choice.why}")
    for policy, r in ((waitpolicy.stored() or {}).get("measured") or {}).items():
        idle = r.get("idle_cpu_pct", float("nan"))
        print(f"  {policy:<8} prefill {r['prefill_tps']:8.1f} tok/s  decode "
              f"{r['decode_tps']:8.1f} tok/s  idle CPU {idle:.1f}%")  # fmt: skip


def _tune_wait_policy(tune: Any, path: Path, result: Any, args: argparse.Namespace) -> Any:
    """Measure bounded spinning and passive waiting with the chosen settings, speed and CPU
    while idle; with --dedicated store the device's choice (bounded only where faster and cool
    while idle). Returns the tuning with the rates of the setting a new process will use."""
    import dataclasses

    from hybridllm.local import waitpolicy

    settings = json.dumps(dataclasses.asdict(result.settings))
    measured: dict[str, dict[str, float]] = {}
    for policy in ("passive", "bounded"):
        if not args.quiet:
            print(f"measuring {policy} waiting (a fresh process) ...", file=sys.stderr)
        measured[policy] = waitpolicy.measure(path, policy, settings, quick=args.quick)
    faster = waitpolicy.pick(measured, dedicated=True, min_gain=tune.MIN_GAIN)
    if args.dedicated:
        stored_at = waitpolicy.save(faster, measured, dedicated=True)
        choice, where = faster, f"stored in {stored_at}"
    else:
        chosen = waitpolicy.choose_safely(threads=result.settings.n_threads)
        choice = "bounded" if chosen.policy == "bounded" else "passive"
        where = f"not stored; a new process decides: {chosen.why}"
    for policy, r in measured.items():
        mark = "  <- in force" if policy == choice else ""
        print(f"{policy} waiting: prefill {r['prefill_tps']:.1f} tokens/s, decode "
              f"{r['decode_tps']:.1f} tokens/s, CPU while idle {r['idle_cpu_pct']:.1f}%"
              f"{mark}")  # fmt: skip
    print(f"wait setting: {choice} ({where}; $OMP_WAIT_POLICY overrides)")
    rates = tune.Rates(measured[choice]["prefill_tps"], measured[choice]["decode_tps"])
    return dataclasses.replace(result, rates=rates)


def _register_tune(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure llama.cpp settings for a local model on this device and keep the fastest",
        description=(
            "Run a short, bounded measurement (threads, flash attention, batch size, KV cache "
            "type) of a local model on this device, and store the fastest settings and the "
            "measured prefill and decode rates beside the model (<model>.tune.json). "
            "LlamaCppEngine uses them from then on."
        ),
    )
    default = "qwen2.5-coder-0.5b-instruct"
    p.add_argument(
        "model", nargs="?", default=default, metavar="MODEL",
        help=f"model name or GGUF path (default: {default})",
    )  # fmt: skip
    p.add_argument("--show", action="store_true", help="print the stored tuning and its rates")
    p.add_argument("--quick", action="store_true", help="shorter measurements (noisier)")
    p.add_argument("--n-ctx", type=positive_int, default=2048, help="context size to measure with")
    p.add_argument("--dedicated", action="store_true",
                   help="nothing else heavy runs on these cores: allow spinning OpenMP threads "
                   "(OMP_WAIT_POLICY=active) where they measure faster")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)


# --- doctor ---------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from hybridllm.cli.doctor import Doctor, report

    return report(Doctor(base_url=args.base_url, model=args.cloud_model).run(), sys.stdout)


def _register_doctor(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check this machine: the llama.cpp build against the CPU, the wait policy, the "
        "models and their tuning, the cloud endpoint",
    )
    p.add_argument(
        "--base-url",
        "--cloud-url",
        dest="base_url",
        help="the cloud endpoint to check (default: $OPENAI_BASE_URL)",
    )
    p.add_argument(
        "--cloud-model",
        help="the model the endpoint must list (default: $OPENAI_MODEL; none: not checked)",
    )
    p.set_defaults(func=cmd_doctor)


# --- serve ----------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from hybridllm.gateway.command import run

    return run(args)


def _register_serve(subparsers: Subparsers) -> None:
    from hybridllm.gateway.command import add_arguments as gateway_arguments
    from hybridllm.server.command import add_arguments, run

    p = subparsers.add_parser(
        "serve",
        help="the hybrid gateway: the hybrid client (local model and cloud, routed per request) "
        "over an OpenAI-compatible HTTP API",
        description="Serve HybridClient over OpenAI's chat-completions API (docs/gateway.md). "
        "The cloud comes from OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL (or --cloud-url "
        "/ --cloud-model); without one it serves the local model only.",
    )
    gateway_arguments(p)
    p.set_defaults(func=cmd_serve)
    p = subparsers.add_parser(
        "serve-model",
        help="serve one model over an OpenAI-compatible HTTP API (chat, and completions with "
        "vLLM's prompt_logprobs for verifying drafts)",
    )
    add_arguments(p)
    p.set_defaults(func=run)


# --- bench and stats ------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    from hybridllm.cli.bench import run_bench  # engines, anyio and the models only when it runs

    return run_bench(args)


def _register_bench(subparsers: Subparsers) -> None:
    from hybridllm.cli.bench.options import add_arguments

    p = subparsers.add_parser(
        "bench",
        help="measure TTFT, TPOT and throughput of this machine's local model and a cloud",
        description=(
            "Measure, on this machine and endpoint: TTFT against input length per engine (with "
            "the local prefill floor), TPOT and throughput against concurrency on the cloud, "
            "total time against TTFT + TPOT x tokens, and the TTFT distribution of each routing "
            "strategy on a mixed workload. Prints a table; --json and --plots write the figures. "
            "Without OPENAI_BASE_URL (or --cloud-url) a stand-in cloud is started on 127.0.0.1."
        ),
    )
    add_arguments(p)
    p.set_defaults(func=cmd_bench)


def cmd_stats(args: argparse.Namespace) -> int:
    from hybridllm.cli.stats import run_stats

    return run_stats(args)


def _register_stats(subparsers: Subparsers) -> None:
    from hybridllm.cli.stats import since_seconds

    p = subparsers.add_parser(
        "stats",
        help="percentiles and counts of a decision log's last hour, day or week",
        description=(
            "Read a decision log (HybridClient(decision_log=...)) and print P50/P95/P99 of TTFT, "
            "TPOT, ITL and the delivery hop, with counts, overall, per policy and per engine, "
            "as HybridClient.stats() computes them."
        ),
    )
    p.add_argument(
        "--log",
        required=True,
        metavar="URL",
        help="the decision log: a path, sqlite://PATH or redis://HOST:PORT/DB[?prefix=NAME]",
    )
    p.add_argument(
        "--since",
        type=since_seconds,
        default=since_seconds("1d"),
        metavar="SPAN",
        help="how far back: 1h, 1d, 7d (N and m, h, d or w; default 1d)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--plot", metavar="PNG", help="write the TTFT distribution over time here")
    p.set_defaults(func=cmd_stats)


# --- policy ---------------------------------------------------------------------------------


def cmd_policy_migrate(args: argparse.Namespace) -> int:
    from hybridllm.cli.policy_migrate import migrate_file

    out = None if args.output == "-" else Path(args.output or args.file)
    text = migrate_file(Path(args.file), out)
    if out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {out} (the policy in tables)", file=sys.stderr)
    return 0


def _register_policy(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("policy", help="work with policy files")
    sub = group.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser(
        "migrate",
        help="rewrite a policy file of the old flat form into tables, comments kept",
        description="Rewrite FILE (old flat fields such as hedge_after_ms) into the policy "
        "tables ([routing], [hedge], ...), keeping its comments; the result is checked by "
        "loading it before anything is written.",
    )
    p.add_argument("file", metavar="FILE", help="the policy file (.toml)")
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="where to write it ('-': standard output; default: FILE itself, in place)",
    )
    p.set_defaults(func=cmd_policy_migrate)


def _register_keys(subparsers: Subparsers) -> None:
    from hybridllm.cli import keys

    keys.register(subparsers)


_REGISTRARS: list[Callable[[Subparsers], None]] = [
    _register_models,
    _register_demo,
    _register_explain,
    _register_router,
    _register_tune,
    _register_doctor,
    _register_serve,
    _register_keys,
    _register_policy,
    _register_bench,
    _register_stats,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridllm",
        description="Route LLM requests between a local quantized model and a cloud endpoint.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _REGISTRARS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return func(args)
    except HybridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
