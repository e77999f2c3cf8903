"""Drop-in LLMs for the frameworks voice and agent apps are built on (issue 30).

Each adapter lives in its own module and imports its framework only when that module is
imported, so this package imports nothing heavy:

- `hybridllm.integrations.livekit.HybridLLM`: an `llm.LLM` for LiveKit Agents 1.x
  (the `livekit` extra).
"""
