"""The request runtime: the public `Stream`, the plans that run a request (single, race with
hedge and failover), retries, the cloud circuit, the latency model, the trace, and the gather
step that turns live state into the facts `routing.decide` reads."""
