"""The hybrid gateway (`hybridllm serve`): `HybridClient` over OpenAI's HTTP API, so any OpenAI
client in any language gets hybridllm by changing its base URL.

- `app`: the ASGI app (Starlette): ``POST /v1/chat/completions`` (streamed and not),
  ``GET /v1/models`` (the policies, as ``hybridllm/<policy>``), ``GET /healthz``, ``GET /`` (the
  playground page); its door (key, limits, concurrency, access log).
- `playground`: the playground page (``playground.html``, one file, package data) and its
  Content-Security-Policy.
- `wire`: a request body as the client's call (the policy, `StreamArgs`; an unsupported
  parameter is a 400 naming it).
- `relay`: the client's events as SSE chunks or one completion; hybridllm errors as HTTP ones.
- `shapes`: OpenAI's shapes and the decision under ``"hybridllm"`` (engine, plan, policy,
  TTFT, reason, cost, spans).
- `limits`: the gateway's bounds; `command`: the command line.

It sits above the client and below the command line (ARCHITECTURE.md); what serves ONE model
(the stand-in cloud, `hybridllm serve-model`) is `hybridllm.server`. docs/gateway.md has the
usage, the extension field and the statuses.
"""
