"""hybridllm inside the frameworks voice and agent apps are built on (issue 30).

One module per framework, each importing its framework only when it is imported itself, so
`import hybridllm.integrations` loads none of them:

- `hybridllm.integrations.pipecat.HybridLLMService`: an `LLMService` for pipecat-ai 1.x
  (the `hybridllm[pipecat]` extra).

This room sits above the client (it imports `HybridClient`) and below the command line.
"""
