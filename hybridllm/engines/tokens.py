"""Prompt-token counts without a tokenizer: ONE estimate and ONE upper bound.

`estimate_prompt_tokens(messages)` is what routing, the latency model, the budget pre-check's
reasons and `hybridllm explain` use when no engine has a tokenizer loaded (an engine that has one
answers `Engine.count_tokens()` exactly; `engines.base.count_prompt_tokens` picks). It is
script-aware: BPE vocabularies give English about 4-5 characters per token but CJK, Kana and
Hangul about one token per character or more, so "characters / 4" put a 549-token Chinese prompt
at about 190 tokens.

`prompt_token_bound(messages)` never undercounts, whatever the tokenizer: byte-level BPE (with
byte fallback) makes at most one token per UTF-8 byte, plus the chat template's tokens. Budget
reservations hold this bound (a request may be overstated, never understated).

Calibration of `estimate_text_tokens` (tokens counted by llama.cpp's tokenizer for SmolLM2-135M
(49k vocabulary, English-heavy) and Qwen2.5 (151k vocabulary; the 0.5B and 1.5B share it), on
one sentence or snippet each, against the estimate):

    text                     chars  bytes  SmolLM2  Qwen2.5  estimate
    English prose              126    126       25       25        28
    English, numbers and URL   143    143       51       48        52
    Python code                137    137       61       56        52
    JSON                       100    100       42       41        47
    C++ code                   127    127       62       56        54
    French                     101    108       35       27        28
    Chinese                     50    150       79       29        50
    Japanese (kanji + kana)     48    144       86       38        48
    Korean (Hangul)             49    123      104       30        39
    Russian                     93    173       74       35        42
    Arabic                      82    149       79       29        35
    Greek                       59    110       51       51        52
    Hindi (Devanagari)          58    158       63       55        50
    emoji (9, and a heart)      11     41       31       11        19

The weights are the midpoint the two vocabularies leave: SmolLM2 splits non-Latin text up to
twice as finely as the estimate and Qwen up to half as finely; for Latin text and code both are
within about 15% of it. Where the real count matters, a loaded tokenizer answers instead.

Tools count too (`tools=`, a request's `ToolSpec`): a chat template writes the tool definitions
into the prompt (Qwen2.5: a system block of about 380 characters of instructions, then each
definition as JSON; OpenAI: a TypeScript-like namespace, more compact than the JSON), and the
arguments of the tool calls in earlier assistant messages. The estimate adds the definitions'
JSON, the calls' names and arguments, and the template's words around them; the bound adds, one
token per byte, the definitions and the response format as `tojson` writes them (every non-ASCII
character escaped, HTML-unsafe characters escaped as Jinja's filter does), every string a message
carries besides its role (tool calls, `tool_call_id`, `name`), and the wrappers around them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridllm.tools import ToolSpec

# chat-template tokens the estimate adds (role markers, separators; the assistant turn's start)
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS_PER_PROMPT = 3
# what the bound adds: 8 tokens per message, and 64 per request for a default system prompt
BOUND_TOKENS_PER_MESSAGE = 8
BOUND_TOKENS_PER_PROMPT = 64
# tools: the template's instructions around the definitions (Qwen2.5's: about 95 tokens, 380
# bytes), words around each definition and each call (`<tool_call>{"name": ..., "arguments":
# ...}</tool_call>`: about 12 tokens, 48 bytes)
TEMPLATE_TOKENS_FOR_TOOLS = 100
TEMPLATE_TOKENS_PER_CALL = 12
BOUND_TOKENS_FOR_TOOLS = 512
BOUND_TOKENS_PER_TOOL = 16
BOUND_TOKENS_PER_CALL = 48

# (character class, tokens per character); whatever no class names counts 1 token per character
_LETTERS = re.compile(r"[^A-Za-z]")  # these patterns match what is NOT in the class
_DIGITS = re.compile(r"[^0-9]")  # both vocabularies split numbers digit by digit
_NEWLINES = re.compile(r"[^\n]")
_BLANKS = re.compile(r"[^ \t\r\f\v]")
_RUNS = re.compile(r"[ \t]{2,}")  # indentation: about one token per run
_ASCII_PUNCT = re.compile(r"[^!-/:-@\[-`{-~]")
_LATIN_EXT = re.compile(r"[^\u00c0-\u024f\u1e00-\u1eff]")  # accented Latin letters
# Cyrillic, Armenian, Hebrew, Arabic (and Syriac, Thaana): words of a few characters per token
_ALPHABETIC = re.compile(r"[^\u0400-\u052f\u0530-\u058f\u0590-\u05ff\u0600-\u077f\u0780-\u07bf]")
# CJK radicals, punctuation, Kana, ideographs; Hangul; compatibility ideographs; full width
_CJK = re.compile(r"[^\u1100-\u11ff\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
_ASTRAL = re.compile(r"[^\U00010000-\U0010ffff]")  # emoji and rarer scripts: 4 UTF-8 bytes


def _count(not_class: re.Pattern[str], text: str) -> int:
    """How many characters of `text` are in the class (`not_class` matches all the others)."""
    return len(not_class.sub("", text))


def estimate_text_tokens(text: str) -> int:
    """Tokens in `text` for a typical BPE vocabulary (see the module's calibration table)."""
    if not text:
        return 0
    letters = _count(_LETTERS, text)
    digits = _count(_DIGITS, text)
    newlines = _count(_NEWLINES, text)
    blanks = _count(_BLANKS, text)
    runs = len(_RUNS.findall(text))
    punct = _count(_ASCII_PUNCT, text)
    tokens = letters / 4 + digits + punct * 0.75 + newlines + runs
    if not text.isascii():
        latin = _count(_LATIN_EXT, text)
        alphabetic = _count(_ALPHABETIC, text)
        cjk = _count(_CJK, text)
        astral = _count(_ASTRAL, text)
        counted = letters + digits + newlines + blanks + punct + latin + alphabetic + cjk + astral
        other = len(text) - counted  # Greek, Indic, Thai, symbols, other ASCII controls
        tokens += latin * 1.0 + alphabetic * 0.5 + cjk * 1.0 + astral * 2.0 + other * 1.0
    return max(1, math.ceil(tokens))


def estimate_prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tools: ToolSpec | None = None
) -> int:
    """The prompt's tokens for a chat template, estimated from its text (no tokenizer): the
    messages' contents, the tool calls they carry and the tool definitions (`tools`)."""
    total = TEMPLATE_TOKENS_PER_PROMPT
    for m in messages:
        total += TEMPLATE_TOKENS_PER_MESSAGE + estimate_text_tokens(str(m.get("content") or ""))
        for name, arguments in _calls(m):
            total += TEMPLATE_TOKENS_PER_CALL + estimate_text_tokens(name + arguments)
    if tools is not None and tools.tools:
        total += TEMPLATE_TOKENS_FOR_TOOLS
        total += sum(estimate_text_tokens(json.dumps(t.raw)) for t in tools.tools)
    return total


def prompt_token_bound(messages: Sequence[Mapping[str, Any]], tools: ToolSpec | None = None) -> int:
    """An upper bound on the prompt tokens any endpoint counts for these chat messages, and
    the tool definitions and response format of `tools`."""
    total = BOUND_TOKENS_PER_MESSAGE * len(messages) + BOUND_TOKENS_PER_PROMPT
    for m in messages:
        for key, value in m.items():
            if key not in ("role", "tool_calls"):
                total += sum(len(text.encode("utf-8")) for text in _strings(value))
        for name, arguments in _calls(m):
            total += BOUND_TOKENS_PER_CALL + _json_bytes(name) + _arguments_bytes(arguments)
    if tools is not None:
        if tools.tools:
            total += BOUND_TOKENS_FOR_TOOLS + BOUND_TOKENS_PER_TOOL * len(tools.tools)
            total += sum(_json_bytes(t.raw) for t in tools.tools)
        if tools.response_format is not None:
            total += _json_bytes(tools.response_format.raw)
    return total


def _calls(message: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(name, arguments) of each tool call an assistant message carries (what it lacks: "")."""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list | tuple) else ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(fn, Mapping):
            name, arguments = fn.get("name"), fn.get("arguments")
            yield (
                name if isinstance(name, str) else "",
                arguments if isinstance(arguments, str) else "",
            )


def _strings(value: object) -> Iterator[str]:
    """Every string in a JSON-like value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


_HTML_UNSAFE = re.compile(r"[<>&']")  # Jinja's `tojson` writes each as \u00XX (6 bytes)


def _json_bytes(value: object) -> int:
    """The most bytes `value` takes in a prompt: its UTF-8 (a string as it is), or as JSON
    with every non-ASCII and HTML-unsafe character escaped, whichever is more."""
    if isinstance(value, str):
        raw = len(value.encode("utf-8"))
        return max(raw, len(json.dumps(value)) + 5 * len(_HTML_UNSAFE.findall(value)))
    text = json.dumps(value, default=str)
    return len(text) + 5 * len(_HTML_UNSAFE.findall(text))


def _arguments_bytes(arguments: str) -> int:
    """A call's arguments as a template may write them: as given, as a JSON string (Qwen2.5's
    template writes the text through `tojson`: quotes and escapes escaped again), or parsed and
    written again (spaces after separators, escapes), whichever is more."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return _json_bytes(arguments)
    return max(_json_bytes(arguments), _json_bytes(parsed))
