"""The speculative plan's room: the local model drafts, the cloud verifies, the cloud's text is
served. What is where, top to bottom (each module imports only those below it: an
import-linter contract in pyproject.toml; `ahead` and `outlook`, the three dialects, and
`sampling` and `verifier` each share a layer and do not import each other):

```
plan            the plan: SpeculativeSetup, `speculative` (whether to speculate at all, then
                the rounds, then stepping aside), `build_speculative` (the plan factory)
rounds          one request's rounds: draft, verify through the cloud guard, commit; StepAside
ahead           drafting the next round while this one is verified
outlook         what is known between requests: SpeculationState (verifiers per endpoint),
                Outlook (acceptance, drafting time, round trip: k, and whether it pays)
probe           finding an endpoint's dialect with small fixed requests
dialect_llama   (a) llama-cpp-python's server: echo + logprobs, text-level
dialect_vllm    (b) vLLM's prompt_logprobs: token-level (greedy or sampled) and text-level
dialect_openai  (c) OpenAI Predicted Outputs, text-level
sampling        the speculative sampling rule and the cloud's p from its top N log-probabilities
verifier        what every dialect shares: Round, Verdict, the Verifier protocol, Probed,
                reading an answer (first choice, billed usage, greedy entry)
```

The seams it reaches the engines through are capabilities (`engines.capabilities`): the local
engine `Drafts` (a `Drafter`), the cloud (the guard) `VerifiesAtEndpoint` (a
`VerificationPost` per request). The distribution both sides sample from, `Dist` and the top_p
nucleus of a model's logits, lives below in `engines.nucleus`: the local drafter and the served
model use it too, and the engines may not import the runtime.
"""
