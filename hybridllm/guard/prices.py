"""Prices per cloud model (USD per million input and output tokens), loadable from TOML.

`Prices.shipped()`: the prices hybridllm ships (`prices.toml` beside this module: a few OpenAI
models, dated), which the cloud guard uses when the client is given no `prices=`, so that a
policy's budget caps hold for those models. A model not listed there, such as a user's own
endpoint, needs a prices file of its own (the same format; `default` prices any model).
"""

from __future__ import annotations

import math
import re
import tomllib
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridllm.errors import ConfigError

NANO = 1_000_000_000  # ledger units per USD
_SHIPPED = Path(__file__).with_name("prices.toml")
_SNAPSHOT = re.compile(r"^(?P<model>.+)-\d{4}-\d{2}-\d{2}$")  # "gpt-4o-mini-2024-07-18"


class ModelPrice(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)

    def cost_nano(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Exact cost in nano-dollars, rounded up."""
        per_in = Decimal(str(self.input_per_million)) * 1000  # nano-dollars per token
        per_out = Decimal(str(self.output_per_million)) * 1000
        return math.ceil(per_in * prompt_tokens + per_out * completion_tokens)

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.cost_nano(prompt_tokens, completion_tokens) / NANO


class Prices(BaseModel):
    """Prices per cloud model; `default` prices a model that is not listed (else an error).

    TOML form::

        [models."gpt-4o-mini"]
        input_per_million = 0.15
        output_per_million = 0.60
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, ModelPrice] = Field(default_factory=dict)
    default: ModelPrice | None = None

    def find(self, model: str) -> ModelPrice | None:
        """The model's price: listed, listed for the model a dated snapshot names, or the
        default (None: none of them)."""
        found = self.models.get(model)
        snapshot = _SNAPSHOT.match(model)
        if found is None and snapshot is not None:
            found = self.models.get(snapshot["model"])
        return self.default if found is None else found

    def price(self, model: str) -> ModelPrice:
        """`find`, or a `ConfigError` that names the priced models and the way out."""
        found = self.find(model)
        if found is None:
            known = ", ".join(sorted(self.models)) or "(none)"
            raise ConfigError(
                f"no price for model {model!r}; priced models: {known} (pass prices= with a "
                "TOML file that prices it; format: docs/privacy-and-budget.md)"
            )
        return found

    @classmethod
    def shipped(cls) -> Prices:
        """The prices hybridllm ships (see the module)."""
        return cls.from_toml(_SHIPPED)

    @classmethod
    def from_toml(cls, path: str | Path) -> Prices:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{p}: prices file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(x) for x in err["loc"])
            raise ConfigError(f"{p}: {field}: {err['msg']}") from exc
