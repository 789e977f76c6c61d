// One call through the ledger gateway with an official Node SDK and its default retries (R-GW-6a).
// Usage: node refusal.cjs openai|anthropic BASE_URL KEY
// Prints one JSON line: the error the SDK raised (status, code, message, the headers it saw) and
// every retry sleep it asked for. The SDK's sleep is recorded, not slept (its own module's
// export, which the SDK looks up at each call), so a refusal it would wait an hour on shows as a
// recorded wait and a second request at the service, not as a hang.
'use strict';
const path = require('node:path');

const [sdk, baseURL, apiKey] = process.argv.slice(2);
const pkg = sdk === 'openai' ? 'openai' : '@anthropic-ai/sdk';
const root = path.dirname(require.resolve(pkg));
const sleeper = require(path.join(root, 'internal', 'utils', 'sleep.js'));
const sleeps = [];
sleeper.sleep = (ms) => {
  sleeps.push(ms);
  return Promise.resolve();
};

async function call() {
  const messages = [{ role: 'user', content: 'hi' }];
  if (sdk === 'openai') {
    const OpenAI = require('openai');
    const client = new OpenAI({ baseURL: `${baseURL}/openai/v1`, apiKey });
    return client.chat.completions.create({ model: 'acme/a1', messages });
  }
  const Anthropic = require('@anthropic-ai/sdk');
  const client = new Anthropic({ baseURL: `${baseURL}/anthropic`, apiKey });
  return client.messages.create({ model: 'bolt/b1', max_tokens: 16, messages });
}

call().then(
  () => console.log(JSON.stringify({ ok: true, sleeps })),
  (error) => {
    const headers = error.headers || {};
    const get = (name) => (typeof headers.get === 'function' ? headers.get(name) : headers[name]);
    console.log(JSON.stringify({
      ok: false,
      status: error.status ?? null,
      message: error.message,
      retryAfter: get('retry-after') ?? null,
      shouldRetry: get('x-should-retry') ?? null,
      sleeps,
    }));
  },
);
