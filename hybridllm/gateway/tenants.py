"""Who calls the gateway: the admin key (`--api-key`), one of the virtual keys its ledger holds
(`hybridllm keys`, `hybridllm.guard.keys`), or, on a gateway with neither, anybody (loopback).

`Keyring.caller` reads the request's ``Authorization: Bearer KEY`` (the admin key compared in
constant time; a virtual key found by its hash, re-read on every request so a revoked key is
refused from the next request on, by every gateway sharing the ledger); `Keyring.admit` counts a
chat request against its key's `rpm` (shared through the ledger: `hybridllm.guard.rates`).
`usage` is the body of ``GET /v1/usage``.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from hybridllm.errors import LedgerUnavailableError
from hybridllm.guard.budget import Ledger, Quota, tenant_caps, tenant_quota
from hybridllm.guard.keys import KeySpec, KeyStore
from hybridllm.guard.rates import RateCounter
from hybridllm.server.schema import ApiError

__all__ = ["Caller", "Keyring", "usage"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's caller: `key`, a virtual key's spec (None: the admin key, or anybody on a
    gateway without keys: every policy, every key's usage)."""

    key: KeySpec | None = None


OPEN = Caller()


def _unauthorized() -> ApiError:
    return ApiError(401, "invalid or missing API key", code="invalid_api_key")


def _unavailable(exc: LedgerUnavailableError, headers: dict[str, str] | None = None) -> ApiError:
    return ApiError(
        503,
        f"the ledger that holds this gateway's keys cannot be reached ({exc.cause})",
        code="ledger_unavailable",
        type="server_error",
        headers=headers,
    )


class Keyring:
    def __init__(
        self,
        admin_key: str | None,
        keys: KeyStore | None = None,
        rates: RateCounter | None = None,
    ) -> None:
        self._admin = None if admin_key is None else f"Bearer {admin_key}".encode()
        self.keys, self.rates = keys, rates

    @property
    def keyed(self) -> bool:
        """May a request carry a key (an admin key, or a ledger that can hold keys)?"""
        return self._admin is not None or self.keys is not None

    async def caller(self, authorization: str) -> Caller | ApiError:
        """The caller, or the 401 (a missing or wrong key where one is asked) or 503 (the
        ledger is unreachable) that refuses the request."""
        given = authorization.encode()
        if self._admin is not None and secrets.compare_digest(given, self._admin):
            return OPEN
        if self.keys is None:  # no ledger to look in: no thread hop
            return OPEN if self._admin is None else _unauthorized()
        try:
            return await anyio.to_thread.run_sync(self._virtual, authorization)
        except LedgerUnavailableError as exc:
            return _unavailable(exc)

    def _virtual(self, authorization: str) -> Caller | ApiError:
        store = self.keys
        scheme, _, token = authorization.partition(" ")
        if store is not None and scheme.lower() == "bearer" and token:
            spec = store.find(token.strip())
            if spec is not None:
                return Caller(key=spec)
        if self._admin is not None or (store is not None and store.holds_keys()):
            return _unauthorized()
        return OPEN

    async def admit(self, caller: Caller) -> ApiError | None:
        """Count a chat request against its key's `rpm`: None, or the 429 (with its
        Retry-After) past it."""
        spec, rates = caller.key, self.rates
        if spec is None or spec.rpm is None or rates is None:
            return None
        rpm = spec.rpm
        try:
            wait = await anyio.to_thread.run_sync(lambda: rates.hit(f"k:{spec.name}", rpm))
        except LedgerUnavailableError as exc:
            return _unavailable(exc, {"retry-after": "1"})
        if wait is None:
            return None
        return ApiError(
            429,
            f"this key may send {rpm} requests a minute; retry after {math.ceil(wait)} s",
            code="rate_limit_exceeded",
            type="rate_limit_error",
            headers={"retry-after": str(math.ceil(wait))},
        )


def refused_policy(spec: KeySpec, policy: str) -> ApiError:
    return ApiError(
        403,
        f"this key may not use the policy {policy!r} (it may use: "
        f"{', '.join(spec.policies or ())})",
        param="model",
        code="policy_not_allowed",
        type="permission_error",
    )


def _key_usage(ledgers: list[Ledger], spec: KeySpec) -> dict[str, Any]:
    quota: Quota = tenant_quota(ledgers, tenant_caps(spec.tenant), spec.name)
    return {
        "key": spec.name,
        "day": asdict(quota.day),
        "month": asdict(quota.month),
        "exhausted": quota.exhausted,
        "policies": None if spec.policies is None else list(spec.policies),
        "rpm": spec.rpm,
    }


def usage(caller: Caller, ledgers: list[Ledger], keys: KeyStore | None) -> dict[str, Any]:
    """``GET /v1/usage``: a key's own spend and room this UTC day and month; for the admin
    (or an open gateway), every live key's."""
    if caller.key is not None:
        return {"object": "usage", "data": [_key_usage(ledgers, caller.key)]}
    records = [] if keys is None else keys.records()
    data = [_key_usage(ledgers, r.spec) for r in records if not r.revoked]
    return {"object": "usage", "data": data}
