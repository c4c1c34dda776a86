// Loads a GGUF model with real llama.cpp (node-llama-cpp's prebuilt CPU
// build), optionally with LoRA adapter GGUFs at given scales, evaluates
// given token ids and prints the next-token probability distribution over
// the whole vocabulary after the last one.
//
// Usage: node probe.mjs REQUEST.json
// REQUEST: {"model": PATH, "cases": [{"loras": [{"path": PATH, "scale": 1}],
//           "prompts": [[ID, ...], ...]}, ...]}
// Prints: {"vocab": N, "cases": [{"probs": [[P0, ..., PN-1], ...]}, ...]}
// Each case has its own context (its own adapters); each prompt is
// evaluated from an empty sequence. The probabilities are llama.cpp's
// softmax of the raw logits (greedy sampler: no temperature, top-k, top-p
// or penalties touch them).
import { readFileSync } from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const req = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({
  gpu: false,
  build: "never",
  skipDownload: true,
  progressLogs: false,
  logLevel: LlamaLogLevel.error,
});
const model = await llama.loadModel({ modelPath: req.model, gpuLayers: 0 });
const out = { cases: [] };
let n = 0;
for (const c of req.cases) {
  // An F32 KV cache, so a model of F32 weights is compared without the
  // rounding of llama.cpp's default F16 cache.
  const opts = {
    contextSize: 256, batchSize: 256, sequences: 1, threads: 2, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
  };
  if (c.loras && c.loras.length > 0) {
    opts.lora = { adapters: c.loras.map((l) => ({ filePath: l.path, scale: l.scale ?? 1 })) };
  }
  const ctx = await model.createContext(opts);
  const seq = ctx.getSequence();
  const res = { probs: [] };
  for (const prompt of c.prompts) {
    await seq.clearHistory();
    const input = prompt.map((t, i) =>
      i === prompt.length - 1 ? [t, { generateNext: { probabilities: true } }] : t,
    );
    const results = await seq.controlledEvaluate(input);
    const probs = results[results.length - 1].next.probabilities;
    n = Math.max(n, probs.size);
    // Dense by token id; an id past the map's size would leave a hole the
    // caller sees as a wrong length.
    const dense = [];
    for (const [tok, p] of probs) dense[tok] = p;
    res.probs.push(Array.from(dense, (p) => p ?? 0));
  }
  out.cases.push(res);
  await ctx.dispose();
}
out.vocab = n;
process.stdout.write(JSON.stringify(out));
await model.dispose();
await llama.dispose();
