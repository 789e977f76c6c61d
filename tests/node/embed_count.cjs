// The official Node SDKs' `embeddings.create` (openai) and `messages.countTokens`
// (@anthropic-ai/sdk) through the ledger gateway (R-FMT-3, R-FMT-4, R-FMT-5).
// Usage: node embed_count.cjs embed|count BASE_URL KEY MODEL
// Prints one JSON line: for embed, the vectors' indexes and lengths, the model and the usage;
// for count, the input_tokens the route counted. An SDK error prints its status and error body.
'use strict';

const [what, baseURL, apiKey, model] = process.argv.slice(2);
const messages = [{ role: 'user', content: 'hello' }];

async function main() {
  if (what === 'embed') {
    const OpenAI = require('openai');
    const client = new OpenAI({ baseURL: `${baseURL}/openai/v1`, apiKey, maxRetries: 0 });
    const answer = await client.embeddings.create({ model, input: ['first text', 'second text'] });
    return {
      indexes: answer.data.map((d) => d.index),
      lengths: answer.data.map((d) => d.embedding.length),
      model: answer.model,
      usage: answer.usage,
    };
  }
  const Anthropic = require('@anthropic-ai/sdk');
  const client = new Anthropic({ baseURL: `${baseURL}/anthropic`, apiKey, maxRetries: 0 });
  const counted = await client.messages.countTokens({ model, messages });
  return { inputTokens: counted.input_tokens };
}

main().then(
  (result) => console.log(JSON.stringify({ ok: true, ...result })),
  (error) => console.log(JSON.stringify({ ok: false, status: error.status ?? null,
                                          error: error.error ?? null,
                                          message: String(error.message) })),
);
