// Streams one chat completion with tools through the URL given as the first
// argument (an OpenAI-compatible base URL ending in /v1) using the official
// openai npm SDK, and prints what the SDK assembled as one JSON line.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-npm", maxRetries: 0 });
const stream = await client.chat.completions.create({
  model: "qwen3",
  stream: true,
  messages: [{ role: "user", content: "What is in notes.txt?" }],
  tools: [{ type: "function", function: { name: "read", parameters: { type: "object" } } }],
});
let content = "";
let finish = null;
let chunks = 0;
const calls = [];
for await (const chunk of stream) {
  chunks++;
  for (const c of chunk.choices) {
    if (c.delta?.content) content += c.delta.content;
    for (const tc of c.delta?.tool_calls ?? []) {
      calls[tc.index] ??= { id: "", name: "", arguments: "" };
      if (tc.id) calls[tc.index].id = tc.id;
      if (tc.function?.name) calls[tc.index].name += tc.function.name;
      if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
}
console.log(JSON.stringify({ content, tool_calls: calls, finish_reason: finish, chunks }));
