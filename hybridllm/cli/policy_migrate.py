"""`hybridllm policy migrate FILE [-o OUT]`: rewrite a policy file of the old flat form into the
tables (`hybridllm.policy.MOVED` says where each flat field went).

The rewrite works on the text, so comments stay: a comment block above a field, and a comment at
the end of its line, move with it into its table; comments elsewhere stay where they were. The
result is checked by loading it before it is written.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from hybridllm.errors import PolicyError
from hybridllm.policy import MOVED, TABLES, policy_from_data

_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")
_HEADER = re.compile(r"^\s*\[([A-Za-z0-9_.-]+)\]\s*(#.*)?$")


@dataclass
class _Item:
    """One key (its lines, a multi-line value included) with the comment block above it."""

    key: str
    lines: list[str]
    comments: list[str] = field(default_factory=list)


@dataclass
class _Parsed:
    top: list[_Item] = field(default_factory=list)
    tables: dict[str, list[_Item]] = field(default_factory=dict)
    trailing: list[str] = field(default_factory=list)


def _parse(text: str) -> _Parsed:
    parsed, where = _Parsed(), None
    pending: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _HEADER.match(line)
        key = _KEY.match(line)
        if header:
            where = header.group(1)
            parsed.tables.setdefault(where, [])
            if any(c.strip() for c in pending):  # a comment above a header stays above it
                parsed.top.append(_Item("", [], pending))
            pending = []
        elif key:
            end = _value_end(lines, i)
            item = _Item(key.group(1), lines[i : end + 1], pending)
            pending = []
            (parsed.top if where is None else parsed.tables[where]).append(item)
            i = end
        else:
            pending.append(line)
        i += 1
    parsed.trailing = pending
    return parsed


def _value_end(lines: list[str], start: int) -> int:
    """The last line of the key that starts at `start` (a value may span lines)."""
    for end in range(start, len(lines)):
        try:
            tomllib.loads("\n".join(lines[start : end + 1]))
            return end
        except tomllib.TOMLDecodeError:
            continue
    return start


def _renamed(item: _Item, new: str) -> _Item:
    first = re.sub(r"^(\s*)[A-Za-z0-9_-]+", lambda m: m.group(1) + new, item.lines[0], count=1)
    return _Item(new, [first, *item.lines[1:]], item.comments)


def migrate_text(text: str) -> str:
    """The tables form of a flat policy file's text (a file already in tables comes back as
    it is, but for the order of its tables)."""
    parsed = _parse(text)
    top: list[_Item] = []
    tables: dict[str, list[_Item]] = {name: [] for name in TABLES}
    for item in parsed.top:
        if item.key in MOVED:
            table, new = MOVED[item.key]
            tables[table].append(_renamed(item, new))
        else:
            top.append(item)
    for name, items in parsed.tables.items():
        tables.setdefault(name, []).extend(items)
    return _render(top, tables, parsed.trailing)


def _render(top: list[_Item], tables: dict[str, list[_Item]], trailing: list[str]) -> str:
    out: list[str] = []
    for item in top:
        out += item.comments + item.lines
    for name, items in tables.items():
        if not items:
            continue
        while out and not out[-1].strip():
            out.pop()
        out += ["", f"[{name}]"]
        for item in items:
            comments = list(item.comments)
            while comments and not comments[0].strip() and out[-1].startswith("["):
                comments.pop(0)
            out += comments + item.lines
    out += trailing
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out).lstrip("\n") + "\n"


def migrate_file(path: Path, out: Path | None = None) -> str:
    """Rewrite `path` into tables; check the result loads; write it to `out` (None: return
    only). A file that does not load after the rewrite is a `PolicyError` and nothing is
    written."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read: {exc.strerror}", path=path) from None
    new = migrate_text(text)
    try:
        data = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"not valid TOML: {exc}", path=path) from exc
    data.pop("extends", None)  # the parent is checked when the file is loaded
    policy_from_data({"name": path.stem, **data}, path)
    if out is not None:
        out.write_text(new, encoding="utf-8")
    return new
