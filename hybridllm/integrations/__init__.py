"""Drop-in LLMs for the frameworks voice and agent apps are built on (issue 30).

Each adapter lives in its own module and imports its framework only when that module is
imported, so `import hybridllm.integrations` loads none of them:

- `hybridllm.integrations.langchain.HybridChatModel`: a LangChain `BaseChatModel`
  (`pip install 'hybridllm[langchain]'`);
- `hybridllm.integrations.livekit.HybridLLM`: an `llm.LLM` for LiveKit Agents 1.x
  (`pip install 'hybridllm[livekit]'`);
- `hybridllm.integrations.pipecat.HybridLLMService`: an `LLMService` for pipecat-ai 1.x
  (`pip install 'hybridllm[pipecat]'`).

This room sits above the client (it imports `HybridClient`) and below the command line.
"""
