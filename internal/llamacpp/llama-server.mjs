// A stand-in for llama.cpp's llama-server, for tests: its flags and HTTP
// endpoints, answered by real llama.cpp (node-llama-cpp's prebuilt CPU
// build) from the GGUF files it is given, so that a test runs the node's
// llama-server path (the GGUF export, --lora, the blue/green swap) on
// real llama.cpp without a llama-server binary.
//
// Flags (llama.cpp tools/server/README.md): -m/--model FILE, --lora FILE
// (repeatable), --host, --port, -c/--ctx-size N, -np/--parallel N,
// -a/--alias NAME, -t/--threads N. Any other flag is skipped, with the
// word after it when that does not start with "-" (its value), and named
// on stderr.
//
// Endpoints (README.md, in llama-server's shapes):
//   GET  /health               503 {"error": {..., "message": "Loading model"}} while loading, then 200 {"status": "ok"}
//   GET  /v1/models            {"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "llamacpp", "meta"}]}
//   POST /v1/chat/completions  OpenAI's chat completion, streamed ("data: {chunk}" ... "data: [DONE]") or not
// Generation is greedy (whatever the request's temperature), at most
// max_tokens (default 16) tokens, from the messages in Qwen3's chat format.
// Every reply's system_fingerprint names this stand-in and its adapters'
// file names ("stand-in+v1.gguf"), as llama-server's names its build.
// SIGTERM or SIGINT exits at once, cutting the calls in flight, as
// llama-server does. LLAMA_STAND_IN_TOKEN_DELAY_MS, if set, holds each
// streamed token back that long (so that a test's calls are in flight
// long enough to be caught by a swap).
import http from "node:http";
import { basename } from "node:path";
import { getLlama, LlamaCompletion, LlamaLogLevel } from "node-llama-cpp";

const opt = { model: "", lora: [], host: "127.0.0.1", port: 8080, ctx: 1024, parallel: 4, alias: "", threads: 2 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const val = () => {
    if (i + 1 >= argv.length) {
      console.error(`llama-server: ${a} needs a value`);
      process.exit(1);
    }
    return argv[++i];
  };
  switch (a) {
    case "-m": case "--model": opt.model = val(); break;
    case "--lora": opt.lora.push(val()); break;
    case "--host": opt.host = val(); break;
    case "--port": opt.port = Number(val()); break;
    case "-c": case "--ctx-size": opt.ctx = Number(val()); break;
    case "-np": case "--parallel": opt.parallel = Number(val()); break;
    case "-a": case "--alias": opt.alias = val(); break;
    case "-t": case "--threads": opt.threads = Number(val()); break;
    default:
      if (i + 1 < argv.length && !argv[i + 1].startsWith("-")) i++;
      console.error(`llama-server (stand-in): ignoring ${a}`);
  }
}
if (!opt.model) {
  console.error("llama-server: no model (-m FILE)");
  process.exit(1);
}
const modelID = opt.alias || opt.model;
const fingerprint = ["stand-in", ...opt.lora.map((f) => basename(f))].join("+");
const tokenDelay = Number(process.env.LLAMA_STAND_IN_TOKEN_DELAY_MS || 0);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const created = () => Math.floor(Date.now() / 1000);

let ready = false;
let model, context;
const free = []; // sequences not in use
const waiting = []; // calls waiting for one

function send(res, status, body) {
  const b = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json; charset=utf-8", "Content-Length": Buffer.byteLength(b) });
  res.end(b);
}

function error(res, status, message, type) {
  send(res, status, { error: { code: status, message, type } });
}

async function acquire() {
  if (free.length > 0) return free.pop();
  return new Promise((resolve) => waiting.push(resolve));
}

function release(seq) {
  const w = waiting.shift();
  if (w) w(seq);
  else free.push(seq);
}

// Qwen3's chat format (its tokenizer_config.json chat_template), with no
// thinking block.
function prompt(messages) {
  let p = "";
  for (const m of messages) {
    const content = typeof m.content === "string" ? m.content
      : Array.isArray(m.content) ? m.content.map((c) => c.text ?? "").join("") : "";
    p += `<|im_start|>${m.role}\n${content}<|im_end|>\n`;
  }
  return p + "<|im_start|>assistant\n";
}

async function chat(req, res, body) {
  let q;
  try {
    q = JSON.parse(body);
  } catch (e) {
    return error(res, 400, `invalid JSON: ${e.message}`, "invalid_request_error");
  }
  if (!Array.isArray(q.messages) || q.messages.length === 0) {
    return error(res, 400, "'messages' is required", "invalid_request_error");
  }
  const maxTokens = Number.isInteger(q.max_tokens) && q.max_tokens > 0 ? q.max_tokens
    : Number.isInteger(q.max_completion_tokens) && q.max_completion_tokens > 0 ? q.max_completion_tokens : 16;
  const id = "chatcmpl-" + Math.random().toString(36).slice(2, 14);
  const abort = new AbortController();
  res.on("close", () => abort.abort());
  const seq = await acquire();
  const completion = new LlamaCompletion({ contextSequence: seq, autoDisposeSequence: false });
  try {
    await seq.clearHistory();
    const chunk = (delta, finish) => ({
      choices: [{ finish_reason: finish, index: 0, delta }],
      created: created(), id, model: modelID, system_fingerprint: fingerprint, object: "chat.completion.chunk",
    });
    if (q.stream) {
      res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
      res.write(`data: ${JSON.stringify(chunk({ role: "assistant", content: null }, null))}\n\n`);
    }
    const input = model.tokenize(prompt(q.messages), true);
    let n = 0;
    const texts = [];
    const out = await completion.generateCompletionWithMeta(input, {
      maxTokens, temperature: 0, signal: abort.signal, stopOnAbortSignal: true,
      onToken: (t) => { n += t.length; },
      onTextChunk: (text) => {
        if (!q.stream || !text) return;
        if (tokenDelay > 0) texts.push(text);
        else res.write(`data: ${JSON.stringify(chunk({ content: text }, null))}\n\n`);
      },
    });
    for (const text of texts) {
      await sleep(tokenDelay);
      if (abort.signal.aborted) return;
      res.write(`data: ${JSON.stringify(chunk({ content: text }, null))}\n\n`);
    }
    const finish = out.metadata.stopReason === "maxTokens" ? "length" : "stop";
    const usage = { completion_tokens: n, prompt_tokens: input.length, total_tokens: n + input.length };
    if (q.stream) {
      res.write(`data: ${JSON.stringify(chunk({}, finish))}\n\n`);
      if (q.stream_options?.include_usage) {
        res.write(`data: ${JSON.stringify({ choices: [], created: created(), id, model: modelID, system_fingerprint: fingerprint, object: "chat.completion.chunk", usage })}\n\n`);
      }
      res.end("data: [DONE]\n\n");
    } else {
      send(res, 200, {
        choices: [{ finish_reason: finish, index: 0, message: { role: "assistant", content: out.response } }],
        created: created(), model: modelID, system_fingerprint: fingerprint, object: "chat.completion", usage, id,
      });
    }
  } catch (e) {
    if (!res.headersSent) error(res, 500, String(e?.message ?? e), "server_error");
    else res.destroy();
  } finally {
    completion.dispose({ disposeSequence: false });
    release(seq);
  }
}

const server = http.createServer((req, res) => {
  const path = req.url.split("?")[0];
  if (req.method === "GET" && path === "/health") {
    return ready ? send(res, 200, { status: "ok" }) : error(res, 503, "Loading model", "unavailable_error");
  }
  if (!ready) return error(res, 503, "Loading model", "unavailable_error");
  if (req.method === "GET" && (path === "/v1/models" || path === "/models")) {
    return send(res, 200, {
      object: "list",
      data: [{ id: modelID, object: "model", created: created(), owned_by: "llamacpp", meta: { n_ctx_train: opt.ctx } }],
    });
  }
  if (req.method === "POST" && (path === "/v1/chat/completions" || path === "/chat/completions")) {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => { chat(req, res, Buffer.concat(parts).toString("utf8")); });
    return;
  }
  error(res, 404, "File Not Found", "not_found_error");
});

for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
server.listen(opt.port, opt.host, async () => {
  console.log(`llama-server (stand-in): listening on http://${opt.host}:${server.address().port}, loading ${opt.model}` +
    (opt.lora.length ? ` with ${opt.lora.join(", ")}` : ""));
  try {
    const llama = await getLlama({ gpu: false, build: "never", skipDownload: true, progressLogs: false, logLevel: LlamaLogLevel.error });
    model = await llama.loadModel({ modelPath: opt.model, gpuLayers: 0 });
    const o = { contextSize: opt.ctx, sequences: opt.parallel, threads: opt.threads };
    if (opt.lora.length > 0) o.lora = { adapters: opt.lora.map((f) => ({ filePath: f })) };
    context = await model.createContext(o);
    for (let i = 0; i < opt.parallel; i++) free.push(context.getSequence());
  } catch (e) {
    console.error(`llama-server (stand-in): ${e?.message ?? e}`);
    process.exit(1);
  }
  ready = true;
  console.log("llama-server (stand-in): model loaded");
});
