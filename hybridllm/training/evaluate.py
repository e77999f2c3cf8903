"""`hybridllm router eval`: the trained router against baselines, on data it never saw.

On the test split: the quality-versus-cloud-share curve, PGR at cloud shares 10..90%, APGR and
CPT(50/80/95%) for the trained router, the random router (its expected value: all scores tied)
and a length-only heuristic (longer prompts to the cloud), overall and per source. Then
leave-one-source-out: a router trained without one source (train and calibration splits minus
that source), scored on every row of the left-out source. Optionally routers of other labels or
forms trained on the same splits, for comparison. Quality = share answered correctly by the
engine each prompt was routed to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hybridllm.routing import features as F
from hybridllm.routing.labels import Example, Label, as_label
from hybridllm.routing.router import Router
from hybridllm.training.data import by_split
from hybridllm.training.metrics import (
    CPT_TARGETS,
    SHOWN_SHARES,
    Curve,
    Summary,
    apgr_interval,
    routing_curve,
    summarize,
)
from hybridllm.training.train import Form, as_form


@dataclass
class Row:
    """One router's figures on one set of prompts."""

    name: str
    summary: Summary
    curve: Curve
    apgr_ci: tuple[float, float] | None = None  # 90% bootstrap interval


# which prompts a block's figures are over: the whole test split, one source of it, or one
# source's rows that a router trained without that source scored
BlockKind = Literal["test", "source", "left_out"]


@dataclass
class Block:
    """A titled table of routers' figures (`kind`: which prompts, to branch on; `source`: the
    source a "source" or "left_out" block is about; `title`: words for people)."""

    title: str
    rows: list[Row] = field(default_factory=list)
    kind: BlockKind = "test"
    source: str = ""


def length_scores(examples: Sequence[Example]) -> npt.NDArray[np.float64]:
    return np.array([F.extract(ex.prompt).approx_tokens for ex in examples], dtype=np.float64)


def _rows(
    examples: Sequence[Example], routers: Sequence[tuple[str, Router]], *, ci: bool = True
) -> list[Row]:
    local = [ex.local_correct for ex in examples]
    cloud = [ex.cloud_correct for ex in examples]
    scored: list[tuple[str, npt.NDArray[np.float64]]] = [
        (name, np.array([r.score(ex.prompt) for ex in examples])) for name, r in routers
    ]
    scored += [("random", np.zeros(len(examples))), ("length-only", length_scores(examples))]
    out = []
    for name, s in scored:
        curve = routing_curve(s, local, cloud)
        interval = apgr_interval(s, local, cloud) if ci and name != "random" else None
        out.append(Row(name, summarize(curve), curve, interval))
    return out


def evaluate(
    router: Router,
    examples: Sequence[Example],
    *,
    leave_out: Sequence[str] = ("gsm8k", "triviaqa"),
    compare: Sequence[tuple[Label, Form]] = (),
    seed: int = 0,
) -> list[Block]:
    """All blocks of the report (overall, per source, left-out sources)."""
    from hybridllm.training.train import fit

    splits = by_split(examples)
    test = splits["test"]
    label = as_label(router.label)
    form = as_form(router.form)
    routers: list[tuple[str, Router]] = [("router", router)]
    for other_label, other_form in compare:
        other = fit(splits["train"], splits["calibration"], label=other_label, form=other_form,
                    seed=seed)  # fmt: skip
        tag = other_form if other_label == label else other_label
        routers.append((f"router[{tag}]", other.router))
    blocks = [Block(f"test split, all sources (n={len(test)})", _rows(test, routers))]
    for source in sorted({ex.source for ex in test}):
        part = [ex for ex in test if ex.source == source]
        rows = _rows(part, routers[:1], ci=False)
        blocks.append(Block(f"source {source}", rows, "source", source))
    for source in leave_out:
        held = [ex for ex in examples if ex.source == source]
        if not held:
            continue
        fitted = fit(
            [ex for ex in splits["train"] if ex.source != source],
            [ex for ex in splits["calibration"] if ex.source != source],
            label=label,
            form=form,
            seed=seed,
        )
        blocks.append(
            Block(
                f"left out of training: {source} (all its rows, n={len(held)})",
                _rows(held, [("router-without", fitted.router)]),
                "left_out",
                source,
            )
        )
    return blocks


def _f(x: float | None, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "  n/a"
    return f"{x * 100:4.0f}%" if pct else f"{x:5.2f}"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f"{ci[0]:.2f}-{ci[1]:.2f}"


def format_sources(blocks: Sequence[Block]) -> str:
    """One line per source block: n, engine qualities, router vs length-only APGR and CPT80."""
    lines = [
        "per source (test split; PGR is undefined where both engines score the same):",
        f"{'source':<15} {'n':>4} {'q_local':>7} {'q_cloud':>7}  {'APGR':>5} {'CPT80':>5}"
        f"  {'len APGR':>8} {'len CPT80':>9}",
    ]
    for b in blocks:
        if b.kind != "source":
            continue
        r, ln = b.rows[0].summary, b.rows[-1].summary
        lines.append(
            f"{b.source:<15} {r.n:>4} {r.q_weak:7.3f} {r.q_strong:7.3f}  {_f(r.apgr)} "
            f"{_f(r.cpt[0.8], pct=True)}  {_f(ln.apgr):>8} {_f(ln.cpt[0.8], pct=True):>9}"
        )
    return "\n".join(lines) + "\n"


def format_report(blocks: Sequence[Block]) -> str:
    head = (
        f"{'router':<22} {'APGR':>5} {'90% CI':>11} "
        + " ".join(f"CPT{int(t * 100)}" for t in CPT_TARGETS)
        + "  PGR@ "
        + " ".join(f"{int(s * 100):>4}%" for s in SHOWN_SHARES)
    )
    lines: list[str] = []
    for block in blocks:
        if block.kind == "source":
            continue
        first = block.rows[0].summary
        lines.append(
            f"== {block.title}: local-only quality {first.q_weak:.3f}, cloud-only "
            f"{first.q_strong:.3f}"
        )
        lines.append(head)
        for row in block.rows:
            s = row.summary
            lines.append(
                f"{row.name:<22} {_f(s.apgr)} {_ci(row.apgr_ci):>11} "
                + " ".join(f"{_f(s.cpt[t], pct=True):>5}" for t in CPT_TARGETS)
                + "       "
                + " ".join(f"{_f(s.pgr[x]):>5}" for x in SHOWN_SHARES)
            )
        by_name = {r.name: r.summary for r in block.rows}
        main = next(iter(by_name))
        if "length-only" in by_name and not np.isnan(by_name[main].apgr):
            wins = sum(by_name[main].pgr[x] > by_name["length-only"].pgr[x] for x in SHOWN_SHARES)
            lines.append(f"{main} beats length-only at {wins}/{len(SHOWN_SHARES)} shown shares")
        lines.append("")
    return "\n".join(lines)


def quality_table(block: Block) -> str:
    """The quality-versus-cloud-share curve of one block, every 10%."""
    shares = [i / 10 for i in range(11)]
    lines = ["cloud share  " + " ".join(f"{r.name[:12]:>12}" for r in block.rows)]
    for x in shares:
        lines.append(
            f"{x * 100:10.0f}%  " + " ".join(f"{r.curve.quality_at(x):12.3f}" for r in block.rows)
        )
    return "\n".join(lines)


def plot(blocks: Sequence[Block], path: Path) -> None:
    """Quality and PGR versus cloud share for the overall block (and left-out sources)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [blocks[0], *[b for b in blocks if b.kind == "left_out"]]
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 4.2), squeeze=False)
    for ax, block in zip(axes[0], shown, strict=True):
        for row in block.rows:
            style = "--" if row.name == "random" else "-"
            ax.plot(row.curve.shares * 100, row.curve.quality, style,
                    label=f"{row.name} (APGR {row.summary.apgr:.2f})")  # fmt: skip
        ax.set_title(block.title, fontsize=9)
        ax.set_xlabel("cloud share (%)")
        ax.set_ylabel("quality (share answered correctly)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_json(blocks: Sequence[Block]) -> dict[str, Any]:
    return {
        b.title: {
            r.name: {
                "apgr": r.summary.apgr,
                "apgr_ci90": r.apgr_ci,
                "cpt": {str(k): v for k, v in r.summary.cpt.items()},
                "pgr": {str(k): v for k, v in r.summary.pgr.items()},
                "q_local": r.summary.q_weak,
                "q_cloud": r.summary.q_strong,
            }
            for r in b.rows
        }
        for b in blocks
    }
