"""Training and evaluating the router, offline: labelled data and its splits, stage 1 (`train`)
and stage 2 (`stage2`) fitting, the routing metrics, cross-validation, evaluation reports and
writing the artifact (`save`).

Used by the `hybridllm router train|eval|cv|recalibrate` commands, scripts and benchmarks; never
by a request. What a request needs (features, heads, stage 2's scoring, the artifact loader)
stays in `hybridllm.routing`, which never imports this package.
"""
