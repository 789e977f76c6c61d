// The official Node SDK's `responses.create`, plain and streamed, through the ledger gateway
// (R-FMT-2, R-FMT-5). Usage: node responses.cjs BASE_URL KEY MODEL
// Prints one JSON line: the plain answer's text and model, the streamed deltas joined, the
// stream's event types and its final response's text and usage.
'use strict';
const OpenAI = require('openai');

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/openai/v1`, apiKey, maxRetries: 0 });

async function main() {
  const plain = await client.responses.create({ model, input: 'hello', store: false });
  const stream = client.responses.stream({ model, input: 'hello', store: false });
  const types = [];
  const deltas = [];
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === 'response.output_text.delta') deltas.push(event.delta);
  }
  const final = await stream.finalResponse();
  return {
    plainText: plain.output_text,
    plainModel: plain.model,
    streamed: deltas.join(''),
    first: types[0],
    last: types[types.length - 1],
    finalText: final.output_text,
    usage: final.usage,
  };
}

main().then(
  (result) => console.log(JSON.stringify({ ok: true, ...result })),
  (error) => console.log(JSON.stringify({ ok: false, status: error.status ?? null,
                                          message: String(error.message) })),
);
