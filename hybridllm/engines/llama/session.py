"""The synchronous side of `LlamaCppEngine`: everything that touches the `llama_cpp.Llama` object.

Every method here runs in a worker thread (never on the event loop), one request at a time per
model. The async engine drives it step by step: `prepare()` (template + tokenize + context check,
no model work), `prefill()` (interruptible through llama.cpp's abort callback), then `step()` once
per token. `abort()` may be called from any thread and stops a running `llama_decode` at once.
"""

from __future__ import annotations

import codecs
import ctypes
import dataclasses
import logging
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hybridllm import errors
from hybridllm.engines.base import GenerationRequest, Message
from hybridllm.engines.llama.grammar import CheckedGrammar
from hybridllm.engines.llama.kvdisk import DISK_MIN_TOKENS, DiskStates
from hybridllm.engines.llama.kvstore import KVStore, SavedState, common_prefix
from hybridllm.engines.llama.prompt_lookup import DraftMode, DraftStats, PromptLookup
from hybridllm.engines.llama.score import Scorer
from hybridllm.engines.llama.signals import last_logits, logprob
from hybridllm.engines.llama.toolcalls import (
    NAME_WAIT_CHARS,
    ParsedCall,
    ToolPlan,
    call_confidence,
    confidence,
    intended_name,
    json_opening,
    offered,
    parse_call,
    template_messages,
    tool_plan,
)
from hybridllm.local import gguf, loader
from hybridllm.local.settings import LlamaSettings

log = logging.getLogger(__name__)
TOP_K, MIN_P = 40, 0.05  # the sampler's truncation (llama-cpp-python's defaults)

_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Prepared:
    tokens: list[int]
    max_tokens: int
    stop: tuple[str, ...]
    request: GenerationRequest
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (-100: banned)
    tools: ToolPlan | None = None  # calls and JSON answers (`toolcalls`; None: plain text)
    # where the prompt's opening system message ends (its KV state is kept on disk: `kvdisk`);
    # 0: none, or no disk store
    system_tokens: int = 0
    # the answer's first tokens, written at the end of `tokens` (`ToolPlan.opening`: a named
    # function's call opened there); they count as the answer's, not the prompt's
    forced: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.tokens) - self.forced


@dataclass
class Generation:
    """State of one running generation (owned by the worker thread)."""

    prepared: Prepared
    reused_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    tokens_out: list[int] = field(default_factory=list)
    _gen: Iterator[int] | None = None
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _held: str = ""
    _drafter: PromptLookup | None = None
    calls: list[ParsedCall] = field(default_factory=list)  # the complete calls, in order
    # the names of the calls opened so far, each as soon as its JSON has chosen it (before
    # its arguments are written): the engine says so with a `CallOpened` mark
    opened: list[str] = field(default_factory=list)
    _call_at: int | None = None  # where in tokens_out the call being generated starts
    _call_lps: list[float] = field(default_factory=list)  # its tokens' log-probabilities
    # the answer's first text, held while it may still open a call written as JSON (None:
    # decided, or the request cannot call); `toolcalls.json_opening`
    _opening: str | None = None
    _opening_at: int = 0  # where in tokens_out that text starts
    # the model wrote a call to a function the request does not offer: the answer is text
    # (the call token banned, and a JSON opening at its first step)
    _no_call: bool = False


class LlamaSession:
    """Owns one loaded `llama_cpp.Llama`. Not thread-safe: the engine serialises access."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        settings: LlamaSettings,
        extra: dict[str, Any],
    ) -> None:
        self.path = path
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise errors.ModelCorruptError(
                "not a GGUF file (bad magic)", path=path, reason="bad_magic"
            )
        llama_cpp = loader.llama_cpp()  # heavy import: only when a model is really loaded
        self._lc = llama_cpp
        try:
            self.llm: Any = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                verbose=False,
                **{**settings.llama_kwargs(), **extra},
            )
        except (ValueError, RuntimeError) as exc:
            raise _load_error(path, exc) from exc
        # llama-cpp-python 0.3.36 maps ggml's log levels wrongly, so with verbose=False it still
        # prints warnings (e.g. after every abort); its constructor resets the level, so set it here
        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)
        self.n_ctx: int = self.llm.n_ctx()
        self._abort = threading.Event()
        self._yield_if: Callable[[], bool] | None = None  # a preemptible prefill's signal
        self._abort_cb = llama_cpp.ggml_abort_callback(lambda _data: self._cut())
        llama_cpp.llama_set_abort_callback(self.llm.ctx, self._abort_cb, None)
        self._eos = self.llm.token_eos()
        self._vocab = self.llm._model.vocab
        self._formatter = self._make_formatter()
        self._grammars: set[str] = set()  # grammars llama.cpp has parsed once
        # "checked": a grammar checks the tokens the sampler can keep (`grammar.CheckedGrammar`);
        # "whole": llama.cpp's sampler checks the whole vocabulary each step (bench_grammar's arm)
        self.grammar_check: Literal["checked", "whole"] = "checked"
        self._openers: list[int] | None = None  # `_json_openers`, once needed
        self.draft_stats = DraftStats()
        self.kv: KVStore | None = None  # saved KV states of past prompts (`kvstore`)
        self.disk: DiskStates | None = None  # system prompts' states on disk (`kvdisk`)
        self._preloaded = False  # the live state is the one `preload` restored, still unused
        # the app's key for the conversation in the live cache (None: none given), and whether
        # the app has since closed it (`forget`: then it is not saved when another prompt comes)
        self._live_conversation: str | None = None
        self._live_forgotten = False
        self._text_scorer: Scorer | None = None  # `text_logprobs`, once asked

    def _make_formatter(self) -> Any:
        Jinja2ChatFormatter = loader.llama_cpp_part("llama_chat_format").Jinja2ChatFormatter
        template = self.llm.metadata.get("tokenizer.chat_template") or _CHATML
        self._renders_tools = "tools" in template
        model = self.llm._model
        eos = model.token_get_text(self._eos) if self._eos != -1 else ""
        bos_id = self.llm.token_bos()
        bos = model.token_get_text(bos_id) if bos_id != -1 else ""
        return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)

    # ---- requests -----------------------------------------------------------------------

    def render(self, messages: Sequence[Message], tools: Sequence[Any] | None = None) -> str:
        """The prompt through the model's chat template; `tools`: the tool definitions (OpenAI's
        shape), which a template that knows tools writes into the prompt."""
        try:
            rendered = self._formatter(messages=template_messages(messages), tools=tools or None)
            return str(rendered.prompt)
        except Exception as exc:  # jinja errors: raise_exception() in templates, bad roles
            raise errors.LocalEngineError(f"chat template failed: {exc}", engine="local") from exc

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def prepare(self, request: GenerationRequest) -> Prepared:
        """Template and tokenize; refuse a prompt that does not fit before any model work.
        With tools the definitions are rendered and the plan made (`toolcalls.tool_plan`): an
        answer that must call starts with the call's opening token."""
        plan = self.plan(request)
        spec = request.tools
        defined = [dict(t.raw) for t in spec.tools] if spec is not None else None
        tokens = self.tokenize(self.render(request.messages, defined) + request.assistant_prefix)
        forced: list[int] = []
        if plan is not None and plan.start_in_call and plan.trigger is not None:
            tokens.append(plan.trigger)
            if plan.opening and self.grammar_check == "checked":  # fed to the checked grammar
                forced = self.tokenize(plan.opening)
                tokens += forced
        room = self.n_ctx - len(tokens)
        if room < 1:
            raise errors.ContextOverflowError(
                engine="local",
                prompt_tokens=len(tokens),
                max_tokens=request.max_tokens,
                n_ctx=self.n_ctx,
            )
        bias = {t: -100.0 for t in plan.banned} if plan is not None else {}
        return Prepared(
            tokens,
            min(request.max_tokens, room),
            request.stop,
            request,
            bias or None,
            plan,
            self._system_end(request.messages, defined, tokens),
            len(forced),
        )

    def _system_end(
        self, messages: Sequence[Message], defined: list[Any] | None, tokens: list[int]
    ) -> int:
        """How many of `tokens` the opening system message's rendering accounts for (0: no disk
        store, no system message, or one shorter than the store keeps)."""
        if self.disk is None or not messages or messages[0].get("role") != "system":
            return 0
        try:
            alone = self.tokenize(self.render(messages[:1], defined))
        except errors.LocalEngineError:  # a template that will not render a system alone
            return 0
        n = common_prefix(alone, tokens)
        return n if DISK_MIN_TOKENS <= n < len(tokens) - 1 else 0

    def plan(self, request: GenerationRequest) -> ToolPlan | None:
        """The request's tool plan, its grammars checked by llama.cpp's parser."""
        plan = tool_plan(
            request.tools,
            renders_tools=self._renders_tools,
            token_of=self._token_of,
            tokenize=self.tokenize,
        )
        if plan is not None:
            self._check_grammar("tools", plan.call_grammar)
            self._check_grammar("response_format", plan.answer_grammar)
        return plan

    def _token_of(self, text: str) -> int | None:
        tokens = self.tokenize(text)
        return tokens[0] if len(tokens) == 1 else None

    def _check_grammar(self, argument: str, grammar: str | None) -> None:
        if grammar is None or grammar in self._grammars:
            return
        lc = self._lc
        sampler = lc.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
        if not sampler:
            raise errors.InvalidArgumentError(argument, grammar, "a grammar llama.cpp accepts")
        lc.llama_sampler_free(sampler)
        self._grammars.add(grammar)

    def reusable_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading prompt tokens need no prefill: in the live KV cache, or in a saved
        state that `prefill` would restore."""
        live = self.cached_prefix(tokens)
        hit = None if self.kv is None else self.kv.find(tokens)
        return live if hit is None else max(live, min(hit[1], len(tokens) - 1))

    def _warm(self, tokens: Sequence[int], conversation: str | None = None) -> int:
        """Before a prefill: keep the live state if the prompt would cut `min_tokens` of it,
        and bring back a saved state that shares a longer prefix; returns the cached prefix.
        The live cache then holds `conversation` (the app's key, if it gave one)."""
        reuse = self.cached_prefix(tokens)
        kv = self.kv
        if kv is None:
            return reuse
        try:
            return self._swap_in(tokens, kv, reuse, conversation)
        finally:
            self._live_conversation, self._live_forgotten = conversation, False

    def _swap_in(
        self, tokens: Sequence[int], kv: KVStore, reuse: int, conversation: str | None
    ) -> int:
        """Save the live state, bring back the best saved one (`_warm`); the cached prefix."""
        if self._preloaded:  # the state preloaded at start serves a prompt that opens like it
            self._preloaded = False
            if reuse < kv.min_tokens:  # not this one: a fresh cache, not a few borrowed tokens
                self.llm.reset()
                self.llm._ctx.kv_cache_clear()
                reuse = 0
        hit = kv.find(tokens, conversation) or self._from_disk(tokens, kv)
        if self.llm.n_tokens - reuse >= kv.min_tokens and not self._live_forgotten:
            self._save_live(kv)
        if hit is not None and hit[1] - reuse >= kv.min_tokens and self._restore(hit[0]):
            kv.used(hit[0])
            return self.cached_prefix(tokens)
        kv.misses += hit is None
        return reuse

    def preload(self) -> int:
        """At start: make the most recently used system prompt's state on disk the live one,
        so the first request after a restart finds it already in the cache. Returns its
        tokens (0: none)."""
        disk, kv = self.disk, self.kv
        if disk is None or kv is None or not disk.states:
            return 0
        latest = max(disk.states, key=disk.used_at)
        data = disk.read(latest)
        if data is None or not kv.put(latest.tokens, data):
            return 0
        hit = kv.find(latest.tokens)
        self._preloaded = hit is not None and self._restore(hit[0])
        return len(latest.tokens) if self._preloaded else 0

    def _from_disk(self, tokens: Sequence[int], kv: KVStore) -> tuple[SavedState, int] | None:
        """A state on disk for this prompt's opening, read into the RAM store (None: none)."""
        found = None if self.disk is None else self.disk.find(tokens, kv.min_tokens)
        if found is None or self.disk is None:
            return None
        data = self.disk.read(found[0])
        if data is None or not kv.put(found[0].tokens, data):
            return None
        return kv.find(tokens)

    def _save_live(self, kv: KVStore) -> None:
        """Copy the live sequence's KV cells out into the store."""
        data = self._live_bytes()
        if data is not None:
            kv.put(self.llm._input_ids[: self.llm.n_tokens], data, self._live_conversation)

    def forget(self, conversation: str) -> int:
        """The app closed `conversation`: drop its saved state, and do not save the live one if
        it holds that conversation. Returns the bytes freed (llama thread)."""
        if self._live_conversation == conversation:
            self._live_forgotten = True
        return 0 if self.kv is None else self.kv.forget(conversation)

    def _live_bytes(self) -> bytearray | None:
        """llama.cpp's bytes for the live sequence's KV cells (None: it gave none)."""
        lc, ctx = self._lc, self.llm.ctx
        size = lc.llama_state_seq_get_size(ctx, 0)
        data = bytearray(size)
        got = lc.llama_state_seq_get_data(ctx, (ctypes.c_uint8 * size).from_buffer(data), size, 0)
        return None if not got else data if got == size else data[:got]

    def _restore(self, state: SavedState) -> bool:
        """Make a saved state the live one (False: llama.cpp refused it; the cache is empty)."""
        lc, llm = self._lc, self.llm
        llm._ctx.kv_cache_clear()
        size = len(state.data)
        if not lc.llama_state_seq_set_data(
            llm.ctx, (ctypes.c_uint8 * size).from_buffer(state.data), size, 0
        ):
            llm.reset()
            llm._ctx.kv_cache_clear()
            return False
        n = len(state.tokens)
        llm.input_ids[:n] = state.tokens  # the whole buffer (`_input_ids`: its first n_tokens)
        llm.n_tokens = n
        return True

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading prompt tokens are already in the KV cache."""
        n = common_prefix(self.llm._input_ids[: self.llm.n_tokens], tokens)
        return min(n, len(tokens) - 1)

    def prefill(
        self,
        prepared: Prepared,
        *,
        draft: DraftMode | None = None,
        yield_if: Callable[[], bool] | None = None,
    ) -> Generation:
        """Evaluate the uncached part of the prompt (all but its last token).

        `draft="prompt-lookup"`: greedy decoding with drafts looked up in the prompt and the
        output so far, verified in one batch (same tokens as plain greedy decoding).
        `yield_if` (a preemptible request): the prompt is evaluated `YIELD_CHUNK` tokens at a
        time, and `PrefillPreempted` is raised once it returns true, the chunk under way cut by
        llama.cpp's abort callback; what the chunks before it evaluated stays in the KV cache
        (a later prefill reuses what is left of it).
        """
        self._abort.clear()
        gen = Generation(prepared)
        tokens = prepared.tokens
        reuse = self._warm(tokens, prepared.request.conversation)
        llm = self.llm
        if reuse <= 0 or not llm._ctx.kv_cache_seq_rm(-1, reuse, -1):
            reuse = 0
            llm.reset()
        llm.n_tokens = reuse
        gen.reused_tokens = reuse
        self._yield_if = yield_if  # the abort callback cuts a chunk once it says so
        try:
            end = prepared.system_tokens  # kept on disk once evaluated (`kvdisk`)
            if self.disk is not None and reuse < end and not self.disk.has(tokens[:end]):
                self._eval(tokens[reuse:end], yield_if)
                self._save_to_disk(tokens[:end])
                reuse = end
            self._eval(tokens[reuse:-1], yield_if)  # generate() then evaluates the last one
        except RuntimeError as exc:
            self._after_abort()
            if self._abort.is_set():
                raise DecodeAborted from exc
            if yield_if is not None and yield_if():
                raise PrefillPreempted from exc  # the chunk under way was cut: only it is lost
            raise errors.LocalEngineError(f"prefill failed: {exc}", engine="local") from exc
        finally:
            self._yield_if = None
        req = prepared.request
        if draft == "prompt-lookup" and prepared.tools is None:
            gen._drafter = PromptLookup(llm, tokens)
            return gen
        llm.set_seed(req.seed if req.seed is not None else random.randint(0, 2**31 - 1))
        plan = prepared.tools
        if plan is not None and plan.start_in_call:
            gen._call_at = 0
            if prepared.forced and req.tools is not None and req.tools.forced is not None:
                gen.opened.append(req.tools.forced)  # opened with the prompt: named already
                gen.completion_tokens = prepared.forced
        elif plan is not None and plan.trigger is not None and plan.answer_grammar is None:
            self._arm_opening(gen)  # "auto": a call written as JSON is read as a call
        gen._gen = self._generator(gen, tokens)
        return gen

    def _eval(self, todo: Sequence[int], yield_if: Callable[[], bool] | None) -> None:
        """Evaluate `todo` into the KV cache (a preemptible request: `YIELD_CHUNK` at a time)."""
        step = len(todo) if yield_if is None else YIELD_CHUNK
        for i in range(0, len(todo), max(1, step)):
            if yield_if is not None and yield_if():
                raise PrefillPreempted
            self.llm.eval(todo[i : i + step])

    def _save_to_disk(self, tokens: Sequence[int]) -> None:
        """Write the live sequence (exactly `tokens`) to the disk store; a failed write is a
        miss later, never an error now."""
        if self.disk is None or self.llm.n_tokens != len(tokens):
            return
        data = self._live_bytes()
        if data is not None:
            try:
                self.disk.write(tokens, data)
            except OSError as exc:
                log.warning("could not keep a system prompt's KV state on disk: %s", exc)

    def _generator(self, gen: Generation, tokens: Sequence[int]) -> Iterator[int]:
        """llama.cpp's sampling loop over `tokens` (a cached prefix reused), under the grammar
        of the phase `gen` is in: a call's JSON, a JSON answer, or none."""
        prepared, req = gen.prepared, gen.prepared.request
        plan = prepared.tools
        grammar, start = None, len(prepared.tokens)  # where the phase's text began
        if plan is not None and gen._call_at is not None:
            start += gen._call_at - _opened_tokens(gen)  # a call the prompt opened: from there
            grammar = plan.call_grammar
        elif plan is not None and not gen.calls:
            grammar = plan.answer_grammar
        bias = dict(prepared.logit_bias or {})
        processors = []
        if gen._no_call and plan is not None and plan.trigger is not None:
            bias[plan.trigger] = -100.0  # no call, and no call written as JSON to begin with
            processors.append(_banned_once(self._json_openers(), len(tokens)))
        if bias:
            processors.append(_biased(bias)[0])
        whole = grammar is not None and self.grammar_check == "whole"
        if grammar is not None and not whole:  # last: after the bans, as llama.cpp's would be
            processors.append(self._checked(grammar, req.temperature, start))
        generated: Iterator[int] = self.llm.generate(
            list(tokens),
            temp=req.temperature,
            top_p=req.top_p,
            top_k=TOP_K,
            min_p=MIN_P,
            repeat_penalty=1.0,
            reset=True,
            logits_processor=processors or None,
            grammar=self._lc.LlamaGrammar.from_string(grammar) if whole else None,
        )
        return generated

    def _checked(self, grammar: str, temperature: float, start: int) -> CheckedGrammar:
        """The grammar as a processor over the tokens the sampler can keep (`_generator`'s
        top_k and min_p), fed what the phase wrote from `start` (a resumed JSON answer)."""
        greedy = temperature == 0.0
        min_p = MIN_P if temperature > 0.0 else 0.0
        return CheckedGrammar(
            self._lc, self._vocab, grammar, greedy=greedy, top_k=TOP_K, min_p=min_p, start=start
        )

    def resume(
        self,
        gen: Generation,
        draft: DraftMode | None = None,
        yield_if: Callable[[], bool] | None = None,
    ) -> int:
        """Go on with a paused generation (`close()`d after some steps, the KV cache since used
        by other requests): prefill its prompt and the tokens it has generated, less the prefix
        still cached, then decode on from there. The text state (held-back stop-string tail,
        a half-decoded UTF-8 character, the counts) is the generation's own, so nothing is
        repeated or lost. Returns the tokens prefilled again."""
        if gen._call_at is not None:  # a call cut short starts again (its grammar state is gone)
            del gen.tokens_out[gen._call_at :]
        tokens = gen.prepared.tokens + gen.tokens_out
        again = dataclasses.replace(gen.prepared, tokens=tokens)
        fresh = self.prefill(again, draft=draft, yield_if=yield_if)
        gen._gen, gen._drafter = fresh._gen, fresh._drafter
        if gen.prepared.tools is not None:  # the grammar of the phase it was in
            gen._gen = self._generator(gen, tokens)
        return len(tokens) - fresh.reused_tokens

    def step(self, gen: Generation, yield_if: Callable[[], bool] | None = None) -> str | None:
        """Decode one token; return new text ('' while held back), None when finished.
        `yield_if` (a preemptible request): the step is cut by llama.cpp's abort callback once
        it returns true, and `PrefillPreempted` is raised (nothing delivered is lost: a resume
        evaluates the last token again)."""
        self._yield_if = yield_if
        try:
            return self._step(gen)
        finally:
            self._yield_if = None

    def _step(self, gen: Generation) -> str | None:
        if gen.finish_reason is not None or (gen._gen is None and gen._drafter is None):
            return None
        if gen.completion_tokens >= gen.prepared.max_tokens:
            return self._finish(gen, "length")
        try:
            if gen._drafter is not None:
                left = gen.prepared.max_tokens - gen.completion_tokens
                room = self.n_ctx - self.llm.n_tokens - 2
                tok = gen._drafter.next_token(max_draft=min(left - 1, room))
            else:
                assert gen._gen is not None
                tok = next(gen._gen)
        except RuntimeError as exc:
            self._after_abort()
            if self._abort.is_set():
                raise DecodeAborted from exc
            if self._yield_if is not None and self._yield_if():
                raise PrefillPreempted from exc
            raise errors.LocalEngineError(f"decode failed: {exc}", engine="local") from exc
        gen.completion_tokens += 1
        plan = gen.prepared.tools
        if gen._call_at is not None:
            gen._call_lps.append(self._logprob(tok))
            return self._call_token(gen, tok)
        if self._lc.llama_vocab_is_eog(self._vocab, tok):
            return self._finish(gen, "tool_calls" if gen.calls else "stop")
        if plan is not None and tok == plan.trigger:
            gen._call_lps = [self._logprob(tok)]  # the model chose to call
            return self._open_call(gen, tok)
        piece = self.llm.detokenize([tok], prev_tokens=gen.tokens_out or None)
        gen.tokens_out.append(tok)
        text = gen._decoder.decode(piece)
        if gen._opening is not None:
            return self._opening_text(gen, text)
        if gen.calls:  # after a call: whitespace before the next is dropped, other text ends
            return self._finish(gen, "tool_calls", flush=False) if text.strip() else ""
        return self._emit(gen, text)

    # ---- tool calls (`toolcalls`): the call's JSON under its grammar, never yielded as text --

    def _open_call(self, gen: Generation, trigger: int) -> str:
        """The model opened a call: decode its JSON under the call grammar from here on."""
        gen.tokens_out.append(trigger)
        gen._call_at = len(gen.tokens_out)
        self._regenerate(gen)
        held, gen._held = gen._held, ""
        return held

    def _opening_text(self, gen: Generation, text: str) -> str | None:
        """The answer's first text under tool_choice "auto": held while it may open a call
        written as a JSON object or a fenced JSON block (`toolcalls.json_opening`); such an
        opening is dropped and the call made in the template's own form, under the call
        grammar; any other opening is released as text."""
        assert gen._opening is not None and gen.prepared.tools is not None
        opening = gen._opening + text
        verdict = json_opening(opening)
        if verdict is None:
            gen._opening = opening
            return ""
        name = intended_name(opening) if verdict else None
        if verdict and name is None and len(opening) < NAME_WAIT_CHARS:
            gen._opening = opening  # a call written as JSON: which function does it call?
            return ""
        gen._opening = None
        if not verdict and gen.calls:  # text after a call is not part of the answer: it ends
            return self._finish(gen, "tool_calls", flush=False)
        if not verdict:
            return self._emit(gen, opening)
        del gen.tokens_out[gen._opening_at :]  # the JSON opening goes: a call, or text, instead
        gen._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        spec = gen.prepared.request.tools
        if name is not None and spec is not None and not offered(name, spec):
            return self._no_tool_fits(gen)
        gen._call_lps = []  # the model chose to call, in its own way
        trigger = gen.prepared.tools.trigger
        assert trigger is not None
        return self._open_call(gen, trigger)

    def _no_tool_fits(self, gen: Generation) -> str:
        """The model wrote a call to a function the request does not offer: no offered tool
        fits, so the answer is text (after a call already made, the answer ends there)."""
        if gen.calls:
            return self._finish(gen, "tool_calls", flush=False) or ""
        gen._no_call = True
        self._regenerate(gen)
        return ""

    def _json_openers(self) -> list[int]:
        """The tokens whose text opens a JSON object or a code fence (found once per model)."""
        if self._openers is None:
            vocab = range(self.llm.n_vocab())
            texts = ((t, self.llm.detokenize([t]).decode("utf-8", "replace")) for t in vocab)
            self._openers = [t for t, s in texts if s.lstrip()[:1] in ("{", "`")]
        return self._openers

    def _arm_opening(self, gen: Generation) -> None:
        """Hold the text from here while it may open a call written as JSON."""
        gen._opening, gen._opening_at = "", len(gen.tokens_out)

    def _logprob(self, tok: int) -> float:
        """The model's log-probability of `tok` at the last evaluated position, from the raw
        logits (before any grammar or logit bias)."""
        return logprob(last_logits(self.llm), tok)

    def _call_token(self, gen: Generation, tok: int) -> str:
        """One token of a call's JSON; the end of the text (all the grammar then allows) closes
        the call: it is parsed, the closing markup added, and plain decoding goes on."""
        assert gen._call_at is not None and gen.prepared.tools is not None
        if not self._lc.llama_vocab_is_eog(self._vocab, tok):
            gen.tokens_out.append(tok)
            if len(gen.opened) <= len(gen.calls):  # its name not said yet
                self._say_name(gen)
            return ""
        text = self._call_text(gen)
        try:
            call = parse_call(text)
        except ValueError as exc:  # not under a working grammar: the runtime would refuse it
            raise errors.InvalidOutputError("local", "tool_call", text, str(exc)) from exc
        gen.calls.append(dataclasses.replace(call, confidence=self._call_confidence(gen)))
        gen._call_lps = []
        gen.tokens_out.extend(gen.prepared.tools.close)
        gen._call_at = None
        if gen.prepared.tools.answer_grammar is None:
            self._arm_opening(gen)  # another call may follow, in either form
        self._regenerate(gen)
        return ""

    def _say_name(self, gen: Generation) -> None:
        """The call's JSON so far has chosen its function (`"name": "..."` closed): note it."""
        named = intended_name(self._call_text(gen))  # the grammar writes it first
        if named is not None:
            gen.opened.append(named)

    def _call_opened(self, gen: Generation) -> str:
        """The call's text the prompt wrote for the model (`ToolPlan.opening`; "": none)."""
        plan = gen.prepared.tools
        return plan.opening if plan is not None and _opened_tokens(gen) else ""

    def _call_text(self, gen: Generation) -> str:
        """The call's JSON so far: what the prompt opened it with, then what the model wrote."""
        assert gen._call_at is not None
        raw = bytes(self.llm.detokenize(gen.tokens_out[gen._call_at :]))
        return self._call_opened(gen) + raw.decode("utf-8", "replace")

    def _call_confidence(self, gen: Generation) -> float | None:
        """The confidence of the call just closed (`toolcalls.call_confidence`) from its JSON's
        tokens: their log-probabilities are the last ones kept but one (the end of the text,
        which the grammar forces where the template would write a newline)."""
        assert gen._call_at is not None
        tokens = gen.tokens_out[gen._call_at :]
        lps = gen._call_lps[-len(tokens) - 1 : -1] if tokens else []
        if len(lps) != len(tokens):
            return confidence(gen._call_lps)
        pieces = [bytes(self.llm.detokenize([t])).decode("utf-8", "replace") for t in tokens]
        return call_confidence(pieces, lps, self._call_opened(gen))

    def _regenerate(self, gen: Generation) -> None:
        """A new sampling loop for the phase `gen` has entered (the KV prefix reused)."""
        old, gen._gen = gen._gen, None
        if old is not None:
            old.close()  # type: ignore[attr-defined]
        gen._gen = self._generator(gen, gen.prepared.tokens + gen.tokens_out)

    def _emit(self, gen: Generation, text: str) -> str | None:
        """Apply stop strings: hold back a tail that might begin one."""
        stops = gen.prepared.stop
        if not stops:
            return text
        buf = gen._held + text
        for s in stops:
            i = buf.find(s)
            if i >= 0:
                self._finish(gen, "stop", flush=False)
                return buf[:i]
        hold = max((k for s in stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        gen._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def _finish(self, gen: Generation, reason: str, *, flush: bool = True) -> str | None:
        """Mark finished; return what was still held back (unless a stop string cut it): an
        opening that could still have been a call, the tail a stop string might begin."""
        gen.finish_reason = reason
        opening, gen._opening = ("" if gen.calls else gen._opening) or "", None
        tail = opening + gen._held + gen._decoder.decode(b"", final=True) if flush else ""
        gen._held = ""
        self.close(gen)
        return tail or None

    def close(self, gen: Generation) -> None:
        d, gen._drafter = gen._drafter, None
        if d is not None:
            self.draft_stats.add(d.batches, d.drafted, d.accepted)
        g, gen._gen = gen._gen, None
        if g is not None:
            g.close()  # type: ignore[attr-defined]

    def text_logprobs(self, prefix: str, text: str) -> list[float]:
        """The log-probability of each token of the plain text `text` after `prefix` (no chat
        template): the live state is kept first where the text would cut it (`_warm`), and the
        scorer evaluates only what the KV cache does not hold (`engines/llama/textscore.py`)."""
        head = self.llm.tokenize(prefix.encode("utf-8"), add_bos=True, special=False)
        tail = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        if not tail:
            return []
        tokens = head + tail
        self._abort.clear()
        self._warm(tokens)
        if self._text_scorer is None:
            self._text_scorer = Scorer(self.llm, top_k=1)
        try:
            scores = self._text_scorer.score(tokens)
        except RuntimeError as exc:  # cut by the abort callback, or a failure
            self._after_abort()
            self._text_scorer.forget()
            if self._abort.is_set():
                raise DecodeAborted from exc
            raise errors.LocalEngineError(f"scoring failed: {exc}", engine="local") from exc
        return [float(x) for x in scores.logprob[len(head) :]]

    # ---- cancellation & warm-up -----------------------------------------------------------

    def abort(self) -> None:
        """Stop a running llama_decode (from any thread)."""
        self._abort.set()

    def _cut(self) -> bool:
        """llama.cpp's abort callback: aborted, or a preemptible prefill told to yield."""
        y = self._yield_if
        return self._abort.is_set() or (y is not None and y())

    def _after_abort(self) -> None:
        # drop whatever a half-finished batch left in the KV cache
        self.llm._ctx.kv_cache_seq_rm(-1, self.llm.n_tokens, -1)

    def warm_up(self) -> tuple[float, float]:
        """Run a short prefill and some decode steps; return (prefill tok/s, decode s/token)."""
        tokens = self.tokenize("Warm-up. " * 24)
        llm = self.llm
        llm.reset()
        # untimed: the first evaluation pays for buffers and threads, and timing it put the
        # prefill rate at a fraction of a real request's (a first local prediction 3-6x slow)
        llm.eval(tokens[:16])
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens[:-1])
        prefill_rate = (len(tokens) - 1) / max(time.perf_counter() - t0, 1e-6)
        gen = llm.generate(tokens, temp=0.0, reset=True)
        next(gen)  # evaluates the last prompt token and samples: not a decode step yet
        steps = []
        for _ in range(8):
            t = time.perf_counter()
            next(gen)
            steps.append(time.perf_counter() - t)
        gen.close()
        llm.reset()
        self._prefill_chat_prefix()
        return prefill_rate, statistics.median(steps)

    def _prefill_chat_prefix(self) -> None:
        """Leave the chat template's fixed start (e.g. a default system prompt) in the KV cache,
        so the first real request reuses it instead of prefilling it."""
        mark = "\x00hybridllm\x00"
        try:
            text = self.render([{"role": "user", "content": mark}])
        except errors.LocalEngineError:
            return
        prefix = self.tokenize(text[: text.index(mark)]) if mark in text else []
        if len(prefix) > 1:
            self.llm.eval(prefix[:-1])  # the last one may merge with the user's first word

    def unload(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.close()


class DecodeAborted(Exception):
    """A decode was aborted on request (llama.cpp's abort callback)."""


def _opened_tokens(gen: Generation) -> int:
    """The tokens of the call under way that the prompt wrote (`Prepared.forced`: a named
    function's call, opened at the answer's start; 0: none, or a later call)."""
    return gen.prepared.forced if gen._call_at == 0 else 0


class PrefillPreempted(Exception):  # noqa: N818  (a signal, not an error)
    """A preemptible prefill stopped between two chunks (`prefill(yield_if=)`)."""


# a preemptible prefill's chunk: what a preemption loses at most (the chunk under way is cut);
# small enough to keep progress during a burst of interactive requests, large enough that the
# extra passes over the weights cost little
YIELD_CHUNK = 8


def _banned_once(ids: list[int], at: int) -> Any:
    """A logits processor banning `ids` at the step that samples position `at` only (the
    first token of a regenerated answer)."""

    def ban(input_ids: Any, scores: Any) -> Any:
        if len(input_ids) == at:
            scores[ids] = -math.inf
        return scores

    return ban


def _biased(bias: dict[int, float]) -> Any:
    """A llama-cpp-python logits processor adding `bias` (OpenAI's logit_bias: -100 bans)."""
    ids, values = list(bias), [(-math.inf if v <= -100 else v) for v in bias.values()]

    def add(_input_ids: Any, scores: Any) -> Any:
        scores[ids] += values
        return scores

    return [add]


def _load_error(path: Path, exc: Exception) -> errors.ModelError:
    """Why llama.cpp refused the file: what its header says is broken (truncated, malformed),
    else, for a whole file whose model did not load, an architecture this build cannot run."""
    if "load model" not in str(exc):  # the model loaded; its context did not
        return errors.ModelCorruptError(f"llama.cpp cannot load the model ({exc})", path=path)
    broken = gguf.diagnose(path)
    if broken is not None:
        return broken
    arch = gguf.read_header(path).architecture
    return errors.ModelUnsupportedError(
        f"this llama.cpp build ({loader.llama_cpp().__version__}) cannot run the model (its "
        f"architecture {arch!r} may be newer than the build): upgrade llama-cpp-python, or "
        "choose a GGUF of a supported architecture",
        path=path,
        architecture=arch,
    )
