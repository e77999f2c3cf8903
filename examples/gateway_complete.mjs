// An editor-style completion client for the hybridllm gateway (`hybridllm serve`), in Node.js 20
// with nothing but its built-in `fetch`: no npm package.
//
//   HYBRIDLLM_URL=http://127.0.0.1:8080/v1 HYBRIDLLM_KEY=KEY node examples/gateway_complete.mjs
//
// What an editor plugin does: as the user types, it asks for a completion of the code before the
// cursor and streams it in as ghost text; when the user types on, it aborts the stale request
// (the gateway then stops the engines: docs/gateway.md) and asks again with the longer prefix.
// Each completion says which engine wrote it and its time to first token, as the client felt it
// and as the gateway's trace measured it (the "hybridllm" field of the last chunk).
// The last line of the output is a JSON summary (the test reads it).
//
// Environment: HYBRIDLLM_URL (default http://127.0.0.1:8080/v1), HYBRIDLLM_KEY (the gateway's
// --api-key; any on loopback without one), HYBRIDLLM_MODEL (a policy; default
// hybridllm/code-completion), HYBRIDLLM_MAX_TOKENS (default 48).

const base = process.env.HYBRIDLLM_URL ?? "http://127.0.0.1:8080/v1";
const key = process.env.HYBRIDLLM_KEY ?? "none";
const model = process.env.HYBRIDLLM_MODEL ?? "hybridllm/code-completion";
const maxTokens = Number(process.env.HYBRIDLLM_MAX_TOKENS ?? "48");

// The buffer as the user types it: a first prefix, then the same line typed further.
const typed = ["def fibonacci(n):\n    ", "def fibonacci(n):\n    if n < 2:\n        return "];

function messages(prefix) {
  return [
    { role: "system", content: "Complete the Python code. Answer with code only." },
    { role: "user", content: prefix },
  ];
}

// Yields each parsed chunk of an SSE body ("data: {...}" lines, ending with "data: [DONE]").
async function* sse(body) {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice("data: ".length);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// One completion request; `stopAfter` chunks of text, then abort (the user typed on).
async function complete(prefix, stopAfter = Infinity) {
  const controller = new AbortController();
  const t0 = performance.now();
  const response = await fetch(`${base}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      model,
      messages: messages(prefix),
      stream: true,
      max_tokens: maxTokens,
      temperature: 0,
    }),
    signal: controller.signal,
  });
  if (!response.ok) {
    const text = await response.text();
    throw new Error(`the gateway answered ${response.status}: ${text}`);
  }
  const out = { text: "", chunks: 0, clientTtftMs: null, decision: null, aborted: false };
  try {
    for await (const chunk of sse(response.body)) {
      const choice = chunk.choices?.[0];
      if (choice?.delta?.content) {
        out.clientTtftMs ??= performance.now() - t0;
        out.text += choice.delta.content;
        out.chunks += 1;
        if (out.chunks >= stopAfter) {
          controller.abort();
          out.aborted = true;
          break;
        }
      }
      if (choice?.finish_reason) out.decision = chunk.hybridllm;
    }
  } catch (error) {
    if (error.name !== "AbortError") throw error;
  }
  return out;
}

const stale = await complete(typed[0], 1);
console.log(`stale request aborted after ${stale.chunks} chunk(s): ${JSON.stringify(stale.text)}`);
const done = await complete(typed[1]);
const d = done.decision ?? {};
console.log(typed[1] + done.text);
console.log(
  `engine=${d.engine} plan=${d.plan} client_ttft_ms=${done.clientTtftMs?.toFixed(0)} ` +
    `gateway_ttft_ms=${d.ttft_ms?.toFixed?.(0)} reason=${d.reason}`,
);
console.log(
  JSON.stringify({
    aborted: stale.aborted,
    aborted_chunks: stale.chunks,
    text: done.text,
    engine: d.engine ?? null,
    client_ttft_ms: done.clientTtftMs,
    gateway_ttft_ms: d.ttft_ms ?? null,
  }),
);
