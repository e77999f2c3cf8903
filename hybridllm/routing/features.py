"""Router features: pure, cheap, language-aware.

`extract(messages)` turns a prompt (a string or a list of `{"role", "content"}` messages) into a
`Features` value: a few named dense signals (approximate token count, turns, code and math
signals, question form, script) and the hashed indices of word 1-2-grams and character 3-4-grams
of the last user message. Long prompts cost little more than short ones: the n-grams and the
script come from a window of the text (its first `HEAD_CHARS` and last `TAIL_CHARS` characters),
and the lengths come from C-speed string methods, never a tokenizer.

Hashing is stable across processes and machines (crc32 for words, a fixed multiply-xorshift for
character n-grams), so a trained weight vector keeps its meaning. Changing anything here that
changes a feature's value must bump `FEATURE_VERSION`: a router artifact trained on another
version refuses to load.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FEATURE_VERSION = 1
N_HASH = 2**16  # hashed n-gram buckets (words and characters share them, with distinct seeds)
HEAD_CHARS = 384
TAIL_CHARS = 256

Messages = str | Sequence[Mapping[str, Any]]

DENSE_NAMES: tuple[str, ...] = (
    "log_tokens",
    "log_tokens_all",
    "turns",
    "has_system",
    "lines",
    "non_ascii",
    "cjk",
    "cyrillic",
    "arabic",
    "other_script",
    "code",
    "code_fence",
    "digits",
    "math_ops",
    "math_words",
    "latex",
    "mc_options",
    "yes_no",
    "wh_word",
    "question_mark",
    "imperative",
    "step_by_step",
)

_U64 = np.uint64
_MIX = _U64(0x9E3779B97F4A7C15)
_MUL = _U64(0x100000001B3)
_SEEDS = {3: _U64(0x51ED2701), 4: _U64(0x2545F491)}

_WORD = re.compile(r"\w+")
_MC_OPTION = re.compile(r"^\s*\(?[A-Ea-e][.)]\s", re.MULTILINE)
_CODE_MARKERS = (
    "def ", "class ", "return", "import ", "#include", "function", "=>", "void ", "const ",
    "print(", "console.", "select ", "{", "}", ";\n", "==", "!=", "()",
)  # fmt: skip
_MATH_OPS = re.compile(r"\d\s*[-+*/^=×÷]\s*\d|[=<>]\s*\d|\d+%")
_MATH_WORDS = (
    "calculat", "compute", "solve", "how many", "how much", "sum", "product", "total",
    "percent", "equation", "integer", "probabilit", "average", "remainder", "divide",
    "multipl", "fraction",
)  # fmt: skip
_LATEX = re.compile(r"\\(frac|sqrt|sum|int|cdot|times|le|ge)\b|\$[^$]+\$")
_YES_NO = re.compile(
    r"^(is|are|was|were|do|does|did|can|could|will|would|should|has|have|had)\b|"
    r"\byes or no\b|\btrue or false\b",
    re.IGNORECASE | re.MULTILINE,
)
_WH = re.compile(r"\b(what|who|whom|whose|when|where|why|which|how)\b", re.IGNORECASE)
_IMPERATIVE = re.compile(
    r"^(write|explain|describe|list|give|summari[sz]e|translate|create|implement|generate|"
    r"rewrite|fix|name|tell)\b",
    re.IGNORECASE | re.MULTILINE,
)
_STEP = re.compile(r"step by step|show your work|reason", re.IGNORECASE)
_CJK = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF))  # kana, Han, Hangul
_CYRILLIC = ((0x0400, 0x04FF),)
_ARABIC = ((0x0600, 0x06FF),)


@dataclass(frozen=True, slots=True)
class Features:
    """One prompt's features: named dense values and hashed n-gram bucket indices."""

    dense: tuple[float, ...]  # in the order of DENSE_NAMES
    hashed: npt.NDArray[np.int64]  # bucket index per n-gram occurrence (repeats count)
    approx_tokens: int

    def dense_dict(self) -> dict[str, float]:
        """The dense features by name (what the decision log stores; no text, no n-grams)."""
        return dict(zip(DENSE_NAMES, self.dense, strict=True))


def approx_tokens(text: str) -> int:
    """Approximate token count without a tokenizer: about 4 ASCII characters per token, and
    about one token per non-ASCII character (CJK and other scripts tokenize densely)."""
    n = len(text)
    if text.isascii():
        return (n + 3) // 4
    extra = len(text.encode("utf-8")) - n  # 1 per 2-byte char, 2 per 3-byte char
    non_ascii = min(n, max(1, extra * 2 // 3))
    return (n - non_ascii + 3) // 4 + non_ascii


def _normalize(messages: Messages) -> list[tuple[str, str]]:
    if isinstance(messages, str):
        return [("user", messages)]
    out: list[tuple[str, str]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        out.append((str(m.get("role", "user")), "" if content is None else str(content)))
    return out


def _window(text: str) -> str:
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def _codes(text: str) -> npt.NDArray[np.uint64]:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


def _in(codes: npt.NDArray[np.uint64], ranges: tuple[tuple[int, int], ...]) -> float:
    hits = np.zeros(len(codes), dtype=bool)
    for lo, hi in ranges:
        hits |= (codes >= lo) & (codes <= hi)
    return float(hits.mean())


def _char_hashes(codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    parts = []
    for n, seed in _SEEDS.items():
        if len(codes) < n:
            continue
        h = np.full(len(codes) - n + 1, seed, dtype=np.uint64)
        for j in range(n):
            h = (h ^ codes[j : len(codes) - n + 1 + j]) * _MUL
        h ^= h >> _U64(29)
        h *= _MIX
        h ^= h >> _U64(32)
        parts.append(h)
    if not parts:
        return np.empty(0, dtype=np.int64)
    return (np.concatenate(parts) % _U64(N_HASH)).astype(np.int64)


def _word_hashes(text: str) -> npt.NDArray[np.int64]:
    words = _WORD.findall(text)
    if not words:
        return np.empty(0, dtype=np.int64)
    h = np.fromiter((zlib.crc32(w.encode()) for w in words), dtype=np.uint64, count=len(words))
    bigrams = (h[:-1] * _MUL) ^ (h[1:] + _MIX)
    bigrams ^= bigrams >> _U64(31)
    allh = np.concatenate([h, bigrams])
    return (allh % _U64(N_HASH)).astype(np.int64)


def extract(messages: Messages) -> Features:
    """Features of one prompt (pure; cost bounded by the window for long prompts)."""
    turns = _normalize(messages)
    users = [c for r, c in turns if r == "user"]
    last = users[-1] if users else (turns[-1][1] if turns else "")
    all_tokens = sum(approx_tokens(c) for _, c in turns)
    tokens = approx_tokens(last)
    win = _window(last)
    low = win.lower()

    codes = _codes(low)
    if win.isascii():
        non_ascii = cjk = cyr = arab = other = 0.0
    else:
        non_ascii = float((codes > 127).mean())
        cjk, cyr, arab = _in(codes, _CJK), _in(codes, _CYRILLIC), _in(codes, _ARABIC)
        other = max(0.0, non_ascii - cjk - cyr - arab)
    digits = sum(win.count(d) for d in "0123456789") / max(1, len(win))
    code_hits = sum(low.count(m) for m in _CODE_MARKERS)
    math_words = sum(low.count(m) for m in _MATH_WORDS)
    first_line = win.lstrip().split("\n", 1)[0]
    dense = (
        math.log1p(tokens) / 4.0,
        math.log1p(all_tokens) / 4.0,
        min(len(users), 10) / 5.0,
        1.0 if any(r == "system" for r, _ in turns) else 0.0,
        math.log1p(last.count("\n")) / 3.0,
        non_ascii,
        cjk,
        cyr,
        arab,
        other,
        min(code_hits, 20) / 5.0,
        1.0 if "```" in win else 0.0,
        min(digits * 5.0, 2.0),
        min(len(_MATH_OPS.findall(win)), 10) / 3.0,
        min(math_words, 10) / 3.0,
        1.0 if _LATEX.search(win) else 0.0,
        min(len(_MC_OPTION.findall(win)), 8) / 4.0,
        1.0 if _YES_NO.search(first_line) or "yes or no" in low else 0.0,
        1.0 if _WH.search(first_line) else 0.0,
        1.0 if "?" in win else 0.0,
        1.0 if _IMPERATIVE.search(first_line) else 0.0,
        1.0 if _STEP.search(win) else 0.0,
    )
    hashed = np.concatenate([_word_hashes(low), _char_hashes(codes)])
    return Features(dense=dense, hashed=hashed, approx_tokens=all_tokens)


def hashed_scale(n: int) -> float:
    """The weight of one n-gram occurrence: 1/sqrt(count), so long windows do not dominate."""
    return 1.0 / math.sqrt(n) if n else 0.0
