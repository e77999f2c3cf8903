"""hybridllm's own OpenAI-compatible server for one GGUF model (`hybridllm serve-model MODEL`).

The stand-in cloud of the demo, the tests and the benchmarks, and the verifier (the gateway over
the hybrid client is `hybridllm serve`, `hybridllm.gateway`). All
llama.cpp work runs on the process's one llama thread, one request at a time; a client that
disconnects cancels its request (a running llama_decode is aborted).

Endpoints:

- ``GET /v1/models``: the one model, under its alias.
- ``POST /v1/chat/completions``: OpenAI's shapes. ``stream: true`` sends SSE chunks (a role
  chunk, content chunks, a finish chunk, then a usage chunk when
  ``stream_options.include_usage`` is set, then ``data: [DONE]``).
- ``POST /v1/completions`` in vLLM's dialect (non-streaming). ``prompt``: a string (tokenized
  as is, no BOS added) or a list of token ids (or a batch of one of either). ``max_tokens`` may
  be 0 (score only). ``echo``: the prompt's text leads ``text``. ``logprobs: k``: OpenAI's legacy
  object (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) for the generated
  tokens, and for the prompt's too with ``echo`` (None at position 0). ``prompt_logprobs: k``
  (0 to 20, or to ``--max-logprobs N``, vLLM's option of that name) adds
  ``choices[0].prompt_logprobs``, exactly as vLLM: a list as long as the prompt, ``None`` at
  position 0, then per position a dict ``{"<token_id>": {"logprob": float, "rank":
  int, "decoded_token": str}}`` holding the prompt's own token at that position (its rank among
  the whole vocabulary, 1 = the model's top choice) first, then the top k (ranks 1..k, best
  first; the prompt's token is not repeated). ``return_tokens_as_token_ids: true`` writes every
  token name as ``"token_id:<id>"``; ``return_token_ids: true`` adds ``prompt_token_ids`` and
  ``token_ids`` to the choice. At temperature 0 with ``prompt_logprobs``, the generated token is
  the top-1 of the last scored position. Above temperature 0, tokens are drawn as vLLM draws
  them: softmax(logits / temperature) cut to the ``top_p`` nucleus (no top_k, no min_p), with
  ``seed`` honoured.
- ``GET /debug/stats``: requests, tokens evaluated and reused by scoring; each completions
  response also carries ``x-hybridllm-evaluated-tokens`` / ``x-hybridllm-reused-tokens``.

Scoring costs one forward pass over the uncached suffix (`engines.llama.score`): a verification
loop that re-sends prompt + committed text + a new draft pays for the new tokens only.

Errors are OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for bad input
(``context_length_exceeded`` for a prompt too long), 401 for a wrong key, 404
(``model_not_found``) for another model's name.
"""
