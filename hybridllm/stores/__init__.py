"""What the stores several processes share have in common: `redis_urls` (a Redis URL's
password hidden, its `?prefix=` split off, a checked connection) for the Redis ledger
(`guard.budget_redis`) and the Redis decision log (`routing.log_redis`).

It sits below routing and guard, which may not import each other, so both reach it; it imports
only `hybridllm.errors`, and redis-py only when a connection is made.
"""
