"""A model's chat template, rendered here: the raw-completion continuation dialect's prompt.

An endpoint with `/v1/completions` takes raw text. Given the served model's chat template (the
Jinja text in its `tokenizer_config.json`, or in its GGUF's `tokenizer.chat_template`), the
client can write the chat prompt itself, open the assistant's turn and put the delivered text
after it: the model then goes on with that text as its own, the way the local engine continues
natively. The rendering follows Transformers' (and llama-cpp-python's): a sandboxed Jinja
environment with `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`,
`strftime_now` and a `tojson` that keeps non-ASCII text.

```python
from hybridllm import OpenAIEngine
from hybridllm.engines.template import ChatTemplate

cloud = OpenAIEngine(base_url=..., model="qwen2.5-0.5b",
                     chat_template=ChatTemplate.of_gguf("qwen2.5-0.5b-instruct"))
```
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hybridllm import errors

__all__ = ["ChatTemplate"]


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _raise(message: str) -> None:
    raise errors.InvalidArgumentError("messages", message, "what the chat template accepts")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A chat template (Jinja source) with the special tokens it writes."""

    source: str
    bos_token: str = ""
    eos_token: str = ""
    _compiled: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise errors.InvalidArgumentError(
                "chat_template", self.source, "a chat template's Jinja text (a non-empty str)"
            )
        object.__setattr__(self, "_compiled", _compile(self.source))

    def prompt(self, messages: Sequence[Mapping[str, Any]], prefix: str = "") -> str:
        """The raw prompt of `messages` with the assistant's turn opened and `prefix` (the
        delivered text) written in it, for the model to go on from. A template that refuses the
        messages (its `raise_exception`, or a Jinja error): `InvalidArgumentError`."""
        import jinja2

        try:
            rendered = self._compiled.render(
                messages=[dict(m) for m in messages],
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                add_generation_prompt=True,
                raise_exception=_raise,
                strftime_now=lambda f: datetime.now().strftime(f),
            )
        except jinja2.TemplateError as exc:
            raise errors.InvalidArgumentError("messages", str(exc), "renderable") from exc
        return str(rendered) + prefix

    @classmethod
    def of_gguf(cls, model: str | Path) -> ChatTemplate:
        """The chat template and special tokens a GGUF model carries (`model`: a path, or a
        manifest name the local cache holds): for a cloud that serves the same model. Reads
        the vocabulary only (no weights)."""
        from hybridllm.local import loader
        from hybridllm.local.resolve import resolve_model

        path = resolve_model(model)
        llm = loader.llama_cpp().Llama(str(path), vocab_only=True, verbose=False)
        try:
            source = llm.metadata.get("tokenizer.chat_template")
            if not source:
                raise errors.InvalidArgumentError(
                    "model", str(model), "a GGUF model that carries a chat template"
                )
            bos, eos = llm.token_bos(), llm.token_eos()
            text = llm._model.token_get_text
            return cls(source, text(bos) if bos != -1 else "", text(eos) if eos != -1 else "")
        finally:
            llm.close()


def _compile(source: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise errors.InvalidArgumentError(
            "chat_template", source, f"a Jinja template ({exc})"
        ) from exc
