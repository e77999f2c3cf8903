"""`hybridllm keys create / list / revoke`: the gateway's virtual keys in a ledger
(`hybridllm.guard.keys`).

    hybridllm keys create --ledger URL --name team-a --budget-day 5 --policies chat,voice-assistant --rpm 60
    hybridllm keys list --ledger URL
    hybridllm keys revoke --ledger URL --name team-a

`create` prints the new key alone on standard output, once (only its hash is kept); a policy
it names must exist (`known_policies`, the bundled ones and `--policy-dir`). Exit codes: 0 done,
1 `revoke` found no such live key, 2 a bad argument.
"""  # noqa: E501

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hybridllm.cli.args import positive_int
from hybridllm.errors import InvalidArgumentError

if TYPE_CHECKING:
    from hybridllm.guard.budget import Ledger

Handler = Callable[[argparse.Namespace], int]


def _usd(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be an amount in USD >= 0, not {text}")
    return value


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("must name at least one policy (a,b,c)")
    return names


def cmd_create(args: argparse.Namespace) -> int:
    from hybridllm.guard.keys import KeySpec, key_store
    from hybridllm.guard.ledgers import ledger_from_url
    from hybridllm.policy import known_policies

    if args.policies is not None:
        known = set(known_policies(dirs=args.policy_dir))
        for name in args.policies:
            if name not in known:
                rule = f"a known policy ({', '.join(sorted(known))})"
                raise InvalidArgumentError("--policies", name, rule)
    spec = KeySpec(args.name, args.budget_day, args.budget_month, args.policies, args.rpm)
    ledger = ledger_from_url(args.ledger, argument="--ledger")
    try:
        secret = key_store(ledger).create(spec)
    finally:
        ledger.close()
    print(secret)
    print(f"key {spec.name!r} created: shown once, keep it now", file=sys.stderr)
    return 0


def _day_spent(ledger: Ledger, name: str) -> str:
    return f"{ledger.spend('day', tenant=name).settled_usd:.6f}"


def cmd_list(args: argparse.Namespace) -> int:
    from hybridllm.cli.progress import render_table
    from hybridllm.guard.keys import key_store
    from hybridllm.guard.ledgers import ledger_from_url

    ledger = ledger_from_url(args.ledger, argument="--ledger")
    try:
        rows = []
        for r in key_store(ledger).records():
            s = r.spec
            rows.append(
                [
                    s.name,
                    "revoked" if r.revoked else "live",
                    "all" if s.policies is None else ",".join(s.policies),
                    time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.created_at)),
                    "-" if s.day_usd is None else f"{s.day_usd:g}",
                    "-" if s.month_usd is None else f"{s.month_usd:g}",
                    "-" if s.rpm is None else str(s.rpm),
                    _day_spent(ledger, s.name),
                ]
            )
    finally:
        ledger.close()
    head = ["NAME", "STATE", "POLICIES", "CREATED (UTC)", "DAY $", "MONTH $", "RPM", "TODAY $"]
    print(render_table(head, rows, numeric_from=4) if rows else "no keys")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from hybridllm.guard.keys import key_store
    from hybridllm.guard.ledgers import ledger_from_url

    ledger = ledger_from_url(args.ledger, argument="--ledger")
    try:
        done = key_store(ledger).revoke(args.name)
    finally:
        ledger.close()
    if not done:
        print(f"no live key named {args.name!r}", file=sys.stderr)
        return 1
    print(f"key {args.name!r} revoked", file=sys.stderr)
    return 0


def register(subparsers: Any) -> None:
    """The `keys` group on `hybridllm`'s subparsers (argparse's private type: Any)."""
    group = subparsers.add_parser("keys", help="the gateway's virtual keys (kept in its ledger)")
    sub = group.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    ledger_help = "the gateway's ledger: a path, sqlite://PATH or redis://HOST:PORT/DB"

    p = sub.add_parser("create", help="make a key; prints it once")
    p.add_argument("--ledger", required=True, metavar="URL", help=ledger_help)
    p.add_argument("--name", required=True, help="the tenant the key bills (unique)")
    p.add_argument("--budget-day", type=_usd, metavar="USD", help="cap per UTC day")
    p.add_argument("--budget-month", type=_usd, metavar="USD", help="cap per UTC month")
    p.add_argument("--policies", type=_policies, metavar="A,B", help="allowed (default: all)")
    p.add_argument("--rpm", type=positive_int, metavar="N", help="requests per minute")
    p.add_argument("--policy-dir", action="append", default=[], metavar="DIR", help="more policies")
    p.set_defaults(func=cmd_create)

    p = sub.add_parser("list", help="every key (never its secret) and today's spend")
    p.add_argument("--ledger", required=True, metavar="URL", help=ledger_help)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("revoke", help="refuse a key from the next request on")
    p.add_argument("--ledger", required=True, metavar="URL", help=ledger_help)
    p.add_argument("--name", required=True, help="the key's name")
    p.set_defaults(func=cmd_revoke)
