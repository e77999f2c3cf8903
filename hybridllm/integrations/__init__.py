"""Drop-in LLMs for the frameworks voice and agent apps are built on (issue 30).

Each adapter lives in its own module and imports its framework only when that module is
imported, so this package imports nothing heavy:

- `hybridllm.integrations.langchain.HybridChatModel`: a LangChain `BaseChatModel`
  (`pip install 'hybridllm[langchain]'`);
- `hybridllm.integrations.livekit.HybridLLM`: an `llm.LLM` for LiveKit Agents 1.x
  (`pip install 'hybridllm[livekit]'`).
"""
