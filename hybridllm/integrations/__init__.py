"""Drop-in LLMs for the frameworks apps are built on: each module imports its framework only
when it is imported itself, so this package imports nothing heavy.

- `hybridllm.integrations.langchain.HybridChatModel`: a LangChain `BaseChatModel`
  (`pip install 'hybridllm[langchain]'`).
"""
