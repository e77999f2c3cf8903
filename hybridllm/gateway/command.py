"""`hybridllm serve`: the gateway's arguments, their checks, and its runner.

Every argument is checked before a model loads or uvicorn starts (`check`): a bad one is one
`ConfigError` naming it (the command prints one line and exits with 2). `--port` 0 to 65535
and free on `--host`, `--host` resolvable, `--local` a manifest name that is pulled, a GGUF
file or an `hf://` model in the hub cache, `--cloud-url` an http(s) URL, `--ledger` a path
or a URL `ledger_from_url` takes,
`--decision-log` a path or a URL `decision_log_from_url` takes (opened, a Redis one reached,
now), `--prices` a prices TOML, the limits >= 1, each `--cors-origin` an origin, `--api-key`
non-blank and REQUIRED when `--host` is not loopback (from `$HYBRIDLLM_GATEWAY_KEY` too), unless
the ledger holds virtual keys (`hybridllm keys create`: then only they, and `--api-key` as the
admin key, are accepted, on loopback too; `hybridllm.gateway.tenants`). The
cloud comes from `$OPENAI_BASE_URL`, `$OPENAI_API_KEY` and `$OPENAI_MODEL`, as the demo reads
them; `--cloud-url` and `--cloud-model` override them. With neither a URL nor a key the gateway
serves the local model only, and says so at start.

More than one cloud: `--cloud NAME=URL`, repeated, names each (in the order the default policy
tries them), with `--cloud-model NAME=MODEL` and its key from `--cloud-key NAME=KEY` or
`$HYBRIDLLM_KEY_<NAME>` (the name upper-cased, "-" and "." as "_"; else `$OPENAI_API_KEY`); or
one file, `--clouds FILE.toml`, of `[clouds.NAME]` tables (`url`, `model`, `key` or `key_env`).
Policies name them (`prefer = "NAME"`, `fallback_order`); the start banner and `/healthz` list
each.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hybridllm import errors
from hybridllm.engines import validate
from hybridllm.gateway.limits import GatewayLimits, is_loopback
from hybridllm.server.command import LOG_LEVELS, check_listen

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from hybridllm.client import HybridClient
    from hybridllm.engines.base import Engine
    from hybridllm.events import EngineName
    from hybridllm.guard.budget import Ledger
    from hybridllm.guard.prices import Prices
    from hybridllm.routing.log import DecisionLogLike
    from hybridllm.runtime.health import EngineState

__all__ = ["KEY_ENV", "CloudSpec", "Settings", "add_arguments", "check", "named_clouds", "run"]

KEY_ENV = "HYBRIDLLM_GATEWAY_KEY"
DEFAULT_LOCAL_MODEL = "qwen2.5-coder-0.5b-instruct"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    p.add_argument(
        "--local",
        metavar="MODEL",
        default=DEFAULT_LOCAL_MODEL,
        help="the local model: a manifest name, a GGUF path, or a hub model pulled with "
        f"`hybridllm models pull hf://...` (default: {DEFAULT_LOCAL_MODEL})",
    )
    p.add_argument("--cloud-url", metavar="URL", help="the cloud endpoint ($OPENAI_BASE_URL)")
    p.add_argument(
        "--cloud-model",
        metavar="MODEL",
        action="append",
        default=[],
        help="the cloud's model ($OPENAI_MODEL); NAME=MODEL for a --cloud NAME (repeatable)",
    )
    p.add_argument(
        "--cloud",
        metavar="NAME=URL",
        action="append",
        default=[],
        help="a named cloud endpoint, in the order tried (repeatable; instead of --cloud-url)",
    )
    p.add_argument(
        "--clouds",
        metavar="TOML",
        help="the named clouds from one file: [clouds.NAME] url, model, key or key_env",
    )
    p.add_argument(
        "--cloud-key",
        metavar="NAME=KEY",
        action="append",
        default=[],
        help="a named cloud's key (default: $HYBRIDLLM_KEY_<NAME>, else $OPENAI_API_KEY)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"demand `Authorization: Bearer KEY` (default: ${KEY_ENV}); required off loopback",
    )
    p.add_argument(
        "--ledger",
        metavar="URL",
        help="the budget ledger: a path, sqlite://PATH or redis://HOST:PORT/DB (shared)",
    )
    p.add_argument(
        "--decision-log",
        metavar="URL",
        help="log each request's route and outcome: a path, sqlite://PATH or redis://HOST:PORT/DB "
        "(shared by several gateways; read it with hybridllm stats --log URL)",
    )
    p.add_argument(
        "--prices",
        metavar="TOML",
        help="the cloud model's prices per 1M tokens (default: the shipped prices.toml)",
    )
    p.add_argument("--max-concurrency", type=int, default=8, help="chat requests at once (8)")
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call (repeatable; default: none, no CORS)",
    )
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="(default: 1000000)")
    p.add_argument("--max-messages", type=int, default=256, help="per request (default: 256)")
    p.add_argument("--max-tokens", type=int, default=4096, help="per request (default: 4096)")
    p.add_argument("--n-threads", type=int, help="llama.cpp threads (default: tuned or all cores)")
    p.add_argument("--log-level", default="info", help="uvicorn's log level (default: info)")


@dataclass(frozen=True)
class CloudSpec:
    """A named cloud of `--cloud NAME=URL`: its endpoint, model and key (None: the defaults)."""

    name: str
    url: str
    model: str | None
    key: str | None
    # a GGUF (path or manifest name) of the served model, whose chat template the engine
    # writes raw-completion continuations with (`engines.template`); None: none
    chat_template: str | None = None


@dataclass(frozen=True)
class Settings:
    """The checked arguments: what `run` builds the gateway from."""

    host: str
    port: int
    local: str
    cloud_url: str | None
    cloud_model: str | None
    cloud: bool
    api_key: str | None
    ledger: Ledger | None
    prices: Prices | None
    decision_log: DecisionLogLike | None
    limits: GatewayLimits
    n_threads: int | None
    log_level: str
    clouds: tuple[CloudSpec, ...] = ()  # named clouds (`--cloud`), in order


def check(args: argparse.Namespace) -> Settings:
    """Every argument checked before any work (see the module); the first bad one raises."""
    from hybridllm.guard.ledgers import ledger_from_url
    from hybridllm.local.resolve import resolve_model
    from hybridllm.routing.logs import decision_log_from_url

    validate.integer("--port", args.port, minimum=0, maximum=65535)
    validate.one_of("--log-level", args.log_level, LOG_LEVELS)
    if args.n_threads is not None:
        validate.integer("--n-threads", args.n_threads, minimum=1)
    limits = _limits(args)
    ledger = None if args.ledger is None else ledger_from_url(args.ledger, argument="--ledger")
    key = _api_key(args.api_key, args.host, keyed=ledger is not None and _holds_keys(ledger))
    clouds = named_clouds(args)
    single_model = [m for m in args.cloud_model if "=" not in m]
    cloud_model = single_model[-1] if single_model else None
    cloud_url = None if clouds else args.cloud_url or os.environ.get("OPENAI_BASE_URL") or None
    if cloud_url is not None:
        _url("--cloud-url", cloud_url)
    if cloud_model is not None:
        validate.text("--cloud-model", cloud_model)
    cloud = not clouds and (cloud_url is not None or bool(os.environ.get("OPENAI_API_KEY")))
    prices = None if args.prices is None else _prices(args.prices)
    dlog = args.decision_log
    dlog = None if dlog is None else decision_log_from_url(dlog, argument="--decision-log")
    resolve_model(args.local)  # ManifestError, ModelNotFoundError: unknown, not pulled, no file
    check_listen(args.host, args.port)
    return Settings(
        args.host,
        args.port,
        args.local,
        cloud_url,
        cloud_model,
        cloud,
        key,
        ledger,
        prices,
        dlog,
        limits,
        args.n_threads,
        args.log_level,
        clouds,
    )


def _url(option: str, url: str) -> str:
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.netloc:
        raise errors.InvalidArgumentError(option, url, "an http(s):// URL")
    return url


def _pairs(option: str, values: list[str]) -> dict[str, str]:
    """`NAME=VALUE` options by name (a name given twice, a bad name, no "=": the option's
    `InvalidArgumentError`)."""
    out: dict[str, str] = {}
    for value in values:
        name, eq, rest = value.partition("=")
        if not eq or not rest.strip():
            raise errors.InvalidArgumentError(option, value, "NAME=VALUE")
        validate.engine_name(option, name)
        if name in out:
            raise errors.InvalidArgumentError(option, value, f"{name!r} once")
        out[name] = rest
    return out


def named_clouds(args: argparse.Namespace) -> tuple[CloudSpec, ...]:
    """The named clouds (`--cloud NAME=URL`, or the `--clouds` file), each with its model and
    key."""
    if getattr(args, "clouds", None):
        given = [o for o, v in (("--cloud", args.cloud), ("--cloud-url", args.cloud_url)) if v]
        if given or args.cloud_key or any("=" in m for m in args.cloud_model):
            raise errors.InvalidArgumentError(
                "--clouds", args.clouds, "the only source of named clouds (no --cloud options)"
            )
        return clouds_file(args.clouds)
    urls = _pairs("--cloud", args.cloud)
    models = _pairs("--cloud-model", [m for m in args.cloud_model if "=" in m])
    keys = _pairs("--cloud-key", args.cloud_key)
    for option, named in (("--cloud-model", models), ("--cloud-key", keys)):
        for name in named:
            if name not in urls:
                raise errors.InvalidArgumentError(option, name, "a NAME given by --cloud NAME=URL")
    if urls and args.cloud_url:
        raise errors.InvalidArgumentError("--cloud-url", args.cloud_url, "absent with --cloud")
    if "local" in urls:
        raise errors.InvalidArgumentError("--cloud", "local", "a name other than 'local'")
    return tuple(
        CloudSpec(name, _url("--cloud", url), models.get(name), keys.get(name) or _key_env(name))
        for name, url in urls.items()
    )


_CLOUD_KEYS = frozenset({"url", "model", "key", "key_env", "chat_template"})


def clouds_file(path: str) -> tuple[CloudSpec, ...]:
    """`--clouds FILE`: `[clouds.NAME]` tables, in the order tried, each with `url` (required),
    `model`, and `key` or `key_env` (the variable holding it; default `$HYBRIDLLM_KEY_<NAME>`,
    else `$OPENAI_API_KEY`), and `chat_template`: a GGUF of the served model (a path or a
    manifest name), whose chat template continues answers as raw completions (llama-cpp-python's
    server knows no other way). A missing file, bad TOML, an unknown key or a bad value is an
    `InvalidArgumentError` naming the option and what is wrong."""
    import tomllib

    def bad(rule: str) -> errors.InvalidArgumentError:
        return errors.InvalidArgumentError("--clouds", path, rule)

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise bad(f"a readable TOML file ({type(exc).__name__}: {exc})") from None
    tables = data.get("clouds")
    if set(data) != {"clouds"} or not isinstance(tables, dict) or not tables:
        raise bad("a TOML file of [clouds.NAME] tables (and nothing else)")
    return tuple(_cloud_table(name, table, bad) for name, table in tables.items())


def _cloud_table(
    name: str, table: object, bad: Callable[[str], errors.InvalidArgumentError]
) -> CloudSpec:
    """One `[clouds.NAME]` table as a `CloudSpec`."""
    validate.engine_name("--clouds", name)
    if name == "local" or not isinstance(table, dict):
        raise bad(f"[clouds.{name}]: a table, under a name other than 'local'")
    unknown = sorted(set(table) - _CLOUD_KEYS)
    if unknown or not all(isinstance(v, str) and v.strip() for v in table.values()):
        raise bad(
            f"[clouds.{name}]: url, model, key, key_env, chat_template as non-blank strings"
            f" ({unknown})"
        )
    if "url" not in table or {"key", "key_env"} <= set(table):
        raise bad(f"[clouds.{name}]: a url, and at most one of key and key_env")
    key = table.get("key") or os.environ.get(table.get("key_env", "")) or None
    if "key_env" in table and key is None:
        raise bad(f"[clouds.{name}]: key_env = {table['key_env']!r} is not set")
    url = _url("--clouds", table["url"])
    model, template = table.get("model"), table.get("chat_template")
    return CloudSpec(name, url, model, key or _key_env(name), template)


def _key_env(name: str) -> str | None:
    """`$HYBRIDLLM_KEY_<NAME>` (upper-cased, "-" and "." as "_"), if set."""
    env = "HYBRIDLLM_KEY_" + name.upper().replace("-", "_").replace(".", "_")
    return os.environ.get(env) or None


def _prices(path: str) -> Prices:
    """`--prices`: a prices TOML (`guard/prices.toml`'s format); a missing or bad file is an
    `InvalidArgumentError` naming the option."""
    from hybridllm.guard.prices import Prices

    try:
        return Prices.from_toml(path)
    except errors.ConfigError as exc:
        raise errors.InvalidArgumentError("--prices", path, f"a prices TOML file ({exc})") from None


def _limits(args: argparse.Namespace) -> GatewayLimits:
    for option in ("--max-concurrency", "--max-body-bytes", "--max-messages", "--max-tokens"):
        validate.integer(option, getattr(args, option[2:].replace("-", "_")), minimum=1)
    try:
        return GatewayLimits(
            max_body_bytes=args.max_body_bytes,
            max_messages=args.max_messages,
            max_tokens=args.max_tokens,
            max_concurrency=args.max_concurrency,
            cors_origins=tuple(args.cors_origin),
        )
    except errors.InvalidArgumentError as exc:  # a CORS origin: named as the option
        raise errors.InvalidArgumentError("--cors-origin", exc.value, exc.rule) from None


def _holds_keys(ledger: Ledger) -> bool:
    from hybridllm.guard.keys import key_store

    return key_store(ledger).holds_keys()


def _api_key(given: str | None, host: str, *, keyed: bool = False) -> str | None:
    """The admin key (the option, else the environment); required where `host` is not loopback
    and the ledger holds no virtual keys (`keyed`: then they guard the door)."""
    key = given if given is not None else os.environ.get(KEY_ENV)
    if key is not None and not key.strip():
        raise errors.InvalidArgumentError("--api-key", "", "a non-blank key")  # never echoed
    if key is None and not keyed and not is_loopback(host):
        raise errors.ConfigError(
            f"--api-key: a key is required to listen on {host} (not loopback): pass --api-key "
            f"or set ${KEY_ENV}"
        )
    return key


def run(args: argparse.Namespace) -> int:
    """Check, say what is served, build the client and serve until interrupted."""
    settings = check(args)
    import uvicorn

    from hybridllm.gateway.app import create_app
    from hybridllm.guard.keys import key_store
    from hybridllm.guard.rates import rate_counter

    client = build_client(settings)
    print(describe(settings, client), file=sys.stderr, flush=True)
    _show_access_log(settings.log_level)
    ledger = settings.ledger
    app = create_app(
        client,
        settings.limits,
        api_key=settings.api_key,
        on_check=say_checked,
        keys=None if ledger is None else key_store(ledger),
        rates=None if ledger is None else rate_counter(ledger),
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # the gateway's own (no query strings, no text): hybridllm.gateway.access
        timeout_graceful_shutdown=2,
    )
    uvicorn.Server(config).run()
    return 0


def _show_access_log(level: str) -> None:
    """The gateway's access log on stderr at uvicorn's levels info and below (uvicorn's own,
    which would show query strings, is off)."""
    access = logging.getLogger("hybridllm.gateway.access")
    if level in ("info", "debug", "trace") and not access.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s access: %(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False


def build_client(settings: Settings) -> HybridClient:
    from hybridllm.client import HybridClient
    from hybridllm.engines.llamacpp import LlamaCppEngine
    from hybridllm.engines.openai_engine import OpenAIEngine
    from hybridllm.engines.template import ChatTemplate

    local = LlamaCppEngine(settings.local, n_threads=settings.n_threads)
    engines: dict[str, Engine] = {"local": local}
    if settings.cloud:
        engines["cloud"] = OpenAIEngine(base_url=settings.cloud_url, model=settings.cloud_model)
    for spec in settings.clouds:
        template = None if spec.chat_template is None else ChatTemplate.of_gguf(spec.chat_template)
        engines[spec.name] = OpenAIEngine(
            base_url=spec.url,
            api_key=spec.key,
            model=spec.model,
            name=spec.name,
            chat_template=template,
        )
    return HybridClient(
        engines=engines,
        ledger=settings.ledger,
        prices=settings.prices,
        decision_log=settings.decision_log,
    )


def say_checked(states: Mapping[EngineName, EngineState]) -> None:
    """What the gateway's check at start found, one line an engine, on stderr."""
    print(checked_lines(states), file=sys.stderr, flush=True)


def checked_lines(states: Mapping[EngineName, EngineState]) -> str:
    lines = []
    for state in states.values():
        verdict = "ok" if state.serves else "NOT SERVING"
        lines.append(f"  checked {state.name}: {verdict}: {state.cause or state.check.detail}")
    return "\n".join(lines)


def describe(settings: Settings, client: HybridClient) -> str:
    """The lines said at start: where (the API, the playground page), which engines, whether a
    key is asked."""
    lines = [f"hybridllm gateway on http://{settings.host}:{settings.port}/v1"]
    lines.append(f"  playground: http://{settings.host}:{settings.port}/ (open it in a browser)")
    lines.append(f"  local: {settings.local}")
    urls = {spec.name: spec.url for spec in settings.clouds}
    urls["cloud"] = settings.cloud_url or "the OpenAI API"
    clouds = [(n, e) for n, e in client.engines.items() if e is not client.local]
    if not clouds:
        lines.append(
            "  cloud: none configured (set OPENAI_BASE_URL / OPENAI_API_KEY or --cloud-url): "
            "serving the local model only"
        )
    for name, engine in clouds:
        lines.append(f"  {name}: {engine.info().model} at {urls.get(name, '?')}")
    keyed = settings.ledger is not None and _holds_keys(settings.ledger)
    auth = "a key is required" if settings.api_key else "no key (loopback only)"
    if keyed:
        admin = " or the admin key" if settings.api_key else ""
        auth = f"the ledger's keys (hybridllm keys list){admin}"
    lines.append(f"  auth: {auth}; at most {settings.limits.max_concurrency} requests at once")
    return "\n".join(lines)
