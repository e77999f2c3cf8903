"""The local engine's internals: everything that touches a loaded `llama_cpp.Llama`.

`LlamaCppEngine` (`engines/llamacpp.py`) is the engine; these are its parts, each run on the one
llama thread of the process (`thread`): the synchronous session (`session`: prepare, prefill,
step, abort), greedy prompt-lookup decoding (`prompt_lookup`), drafting for the speculative plan
(`draft`), the model's own confidence signals for router stage 2 (`signals`, with the
multiple-choice `option_rotations`), prompt scoring (`score`) and the model behind
`hybridllm serve-model` (`served`).
"""
