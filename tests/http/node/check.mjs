// The official `openai` npm package against the scheduler's HTTP door. Run by tests/http/test_node_sdk.py
// with LLMSCHED_HTTP_BASE (e.g. http://127.0.0.1:8080/v1); prints one JSON object of what it saw.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.LLMSCHED_HTTP_BASE,
  apiKey: "unused",
  defaultHeaders: { "x-user-id": "node-user" },
  maxRetries: 0,
});
const messages = [{ role: "user", content: "Tell me a story" }];

const whole = await client.chat.completions.create({ model: "m", messages, max_tokens: 5, ignore_eos: true });

const stream = await client.chat.completions.create({
  model: "m",
  messages,
  max_tokens: 4,
  stream: true,
  stream_options: { include_usage: true },
  ignore_eos: true,
});
let streamed = "";
let finish = null;
let usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length) {
    streamed += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}

const completion = await client.completions.create({ model: "m", prompt: "Once", max_tokens: 3 });

let notFound = null;
try {
  await client.chat.completions.create({ model: "nope", messages });
} catch (err) {
  notFound = { cls: err.constructor.name, status: err.status, code: err.code, retry: err.headers?.get("x-should-retry") };
}

const models = [];
for await (const model of client.models.list()) models.push(model.id);

console.log(
  JSON.stringify({
    whole: { text: whole.choices[0].message.content, finish: whole.choices[0].finish_reason, usage: whole.usage },
    stream: { text: streamed, finish, usage },
    completion: completion.choices[0].text,
    notFound,
    models,
  }),
);
