"""Unknown keywords in a JSON Schema: a typo ("requried", "maxLenght") is no constraint at all.

JSON Schema ignores a keyword it does not know, so a misspelt one is accepted by every
validator and silently lost. `unknown_keywords(schema)` walks the schema's subschemas (the
values of `properties`, `items`, `anyOf`, ...: never the property names themselves) and lists
each keyword that is neither a validation keyword of the schema's draft nor a core, annotation
or content keyword, with its place ("properties.a.requried") and the closest known keyword.
Keywords of the extension convention (`x-...`) are the author's own and pass.

`tools._schema` logs these at WARNING, once per schema text, or refuses them where the tool or
response format says `strict: true`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["UnknownKeyword", "unknown_keywords"]

# keywords every draft knows besides its validators: core, annotations, content, and the
# structure keywords of older drafts (`definitions`, `dependencies`)
_CORE = frozenset(
    "$schema $id id $anchor $dynamicAnchor $recursiveAnchor $vocabulary $comment $defs "
    "definitions title description default examples deprecated readOnly writeOnly "
    "contentMediaType contentEncoding contentSchema format".split()
)
_ONE = (
    "additionalProperties additionalItems not contains propertyNames if then else "
    "unevaluatedItems unevaluatedProperties contentSchema".split()
)
_MAPS = "properties patternProperties $defs definitions dependentSchemas".split()
_LISTS = "oneOf anyOf allOf prefixItems".split()


@dataclass(frozen=True, slots=True)
class UnknownKeyword:
    """`keyword` at `where` (a dotted path inside the schema, "" at its top); `closest`: the
    known keyword it most likely meant (None: none is close)."""

    where: str
    keyword: str
    closest: str | None

    @property
    def path(self) -> str:
        return f"{self.where}.{self.keyword}" if self.where else self.keyword


def unknown_keywords(schema: Mapping[str, Any]) -> tuple[UnknownKeyword, ...]:
    """The keywords of `schema` (a schema valid against its meta-schema) no draft defines."""
    from jsonschema import validators

    cls = validators.validator_for(dict(schema), default=validators.Draft202012Validator)
    known = _CORE | frozenset(cls.VALIDATORS)
    return tuple(_walk(schema, "", known))


def _walk(schema: object, where: str, known: frozenset[str]) -> Iterator[UnknownKeyword]:
    if not isinstance(schema, Mapping):
        return  # a boolean schema, or a list of strings under `dependencies`
    for key in schema:
        if isinstance(key, str) and key not in known and not key.startswith("x-"):
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
            yield UnknownKeyword(where, key, close[0] if close else None)
    for sub, at in _subschemas(schema):
        yield from _walk(sub, f"{where}.{at}" if where else at, known)


def _subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[object, str]]:
    """Each subschema of `schema` with its place relative to it."""
    for key in _ONE:
        if key in schema:
            yield schema[key], key
    items = schema.get("items")
    if isinstance(items, list):  # the tuple form of older drafts
        yield from ((s, f"items.{i}") for i, s in enumerate(items))
    elif items is not None:
        yield items, "items"
    for key in _MAPS:
        value = schema.get(key)
        if isinstance(value, Mapping):
            yield from ((s, f"{key}.{name}") for name, s in value.items())
    for key in _LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            yield from ((s, f"{key}.{i}") for i, s in enumerate(value))
    deps = schema.get("dependencies")
    if isinstance(deps, Mapping):
        yield from ((s, f"dependencies.{name}") for name, s in deps.items())
