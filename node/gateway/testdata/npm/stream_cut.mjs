// Streams one chat completion through the URL given as the first argument
// with the official openai npm SDK, and prints as one JSON line what the SDK
// assembled and whether the stream ended in an error (and its message).
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-npm", maxRetries: 0 });
let content = "";
let error = null;
try {
  const stream = await client.chat.completions.create({
    model: "qwen3",
    stream: true,
    messages: [{ role: "user", content: "Tell me a story." }],
  });
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.content) content += c.delta.content;
    }
  }
} catch (e) {
  error = String(e?.message ?? e);
}
console.log(JSON.stringify({ content, error }));
