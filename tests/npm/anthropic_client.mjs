// lily-server's /v1/messages driven by the official @anthropic-ai/sdk client: create,
// stream (event helpers and finalMessage), countTokens, a tool round trip, a forced tool,
// greedy determinism, and API errors surfacing as the SDK's typed errors.
// Usage: node anthropic_client.mjs BASE_URL API_KEY ; prints "client: N passed, M failed".
import Anthropic from '@anthropic-ai/sdk';

const [base, key] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;
const check = (ok, what) => { if (ok) pass++; else { fail++; console.log('FAIL ' + what); } };
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
const draw = () => ['apple', 'river', 'stone', 'cloud'][Math.floor(Math.random() * 4)] + ' ' + Math.floor(Math.random() * 1000);
let word = draw();

async function main() {
  const ask = () => ({ model: 'lily', max_tokens: 10, temperature: 0, thinking: { type: 'disabled' },
                       system: [{ type: 'text', text: 'You are terse.' }], messages: [{ role: 'user', content: 'Name ' + word }] });
  let p = ask(), m1 = await client.messages.create(p);
  // a few prompts make the random-weight model end within 10 tokens: these checks want a cut-off answer
  for (let i = 0; i < 6 && m1.stop_reason !== 'max_tokens'; i++) { word = draw(); p = ask(); m1 = await client.messages.create(p); }
  check(m1.type === 'message' && m1.role === 'assistant' && m1.id.startsWith('msg_'), 'create: shape');
  check(m1.stop_reason === 'max_tokens' && m1.usage.output_tokens === 10, 'create: max_tokens ' + JSON.stringify(m1));
  const cnt = await client.messages.countTokens({ model: 'lily', system: p.system, messages: p.messages, thinking: p.thinking });
  check(cnt.input_tokens === m1.usage.input_tokens + (m1.usage.cache_read_input_tokens || 0),
        `usage adds up: ${cnt.input_tokens} vs ${JSON.stringify(m1.usage)}`);
  const m2 = await client.messages.create(p);
  check(textOf(m2) === textOf(m1), 'greedy: same text twice');

  // streaming: the SDK's accumulator and its text events agree with the plain answer
  const stream = client.messages.stream(p);
  let deltas = '', events = 0;
  stream.on('text', (t) => { deltas += t; });
  stream.on('streamEvent', () => { events++; });
  const fin = await stream.finalMessage();
  check(textOf(fin) === textOf(m1) && deltas === textOf(m1), `stream text equals plain: '${deltas}' vs '${textOf(m1)}'`);
  check(fin.stop_reason === 'max_tokens' && fin.usage.output_tokens === 10 && events > 4, 'stream: final message ' + JSON.stringify(fin));
  const raw = await client.messages.create({ ...p, stream: true });
  const types = [];
  for await (const ev of raw) types.push(ev.type);
  check(types[0] === 'message_start' && types.at(-1) === 'message_stop' && types.includes('content_block_delta'),
        'raw stream events ' + types.join(','));

  // stop sequence taken from the greedy answer
  const t = textOf(m1);
  if (t.length >= 4) {
    const s = t.slice(2, 4);
    const m3 = await client.messages.create({ ...p, stop_sequences: [s] });
    check(m3.stop_reason === 'stop_sequence' && m3.stop_sequence === s && textOf(m3) === t.slice(0, t.indexOf(s)),
          'stop_sequences ' + JSON.stringify(m3));
  } else check(false, 'greedy answer too short for a stop test: ' + t);

  // tools: forced call, then the round trip with its result
  const tools = [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const q = [{ role: 'user', content: 'weather in ' + word + '?' }];
  const f = await client.messages.create({ ...p, max_tokens: 8, tools, tool_choice: { type: 'tool', name: 'get_weather' }, messages: q });
  const call = f.content.find((b) => b.type === 'tool_use');
  check(call ? call.name === 'get_weather' && f.stop_reason === 'tool_use'
             : textOf(f).includes('<function=get_weather>'), 'forced tool ' + JSON.stringify(f));
  const conv = [...q, { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_x1', name: 'get_weather', input: { city: 'Oslo' } }] },
                { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_x1', content: [{ type: 'text', text: 'rain ' + word }] }] }];
  const c1 = await client.messages.countTokens({ model: 'lily', tools, messages: q });
  const c2 = await client.messages.countTokens({ model: 'lily', tools, messages: conv });
  const r = await client.messages.create({ ...p, max_tokens: 4, tools, messages: conv });
  check(c2.input_tokens > c1.input_tokens && r.type === 'message', `round trip: ${c1.input_tokens} -> ${c2.input_tokens}`);

  // thinking on: a thinking block first
  const th = await client.messages.create({ ...p, max_tokens: 5, thinking: { type: 'enabled', budget_tokens: 1024 } });
  check(th.content[0] && th.content[0].type === 'thinking' && th.content[0].thinking.length > 0, 'thinking ' + JSON.stringify(th));

  // errors as typed SDK errors
  const expectErr = async (fn, cls, status, what) => {
    try { await fn(); check(false, what + ': no error'); }
    catch (e) { check(e instanceof cls && e.status === status && e.error?.type === 'error', what + ': ' + e); }
  };
  await expectErr(() => client.messages.create({ ...p, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
                  Anthropic.BadRequestError, 400, 'image block');
  await expectErr(() => client.messages.create({ model: 'lily', messages: q }), Anthropic.BadRequestError, 400, 'missing max_tokens');
  const wrong = new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
  await expectErr(() => wrong.messages.create(p), Anthropic.AuthenticationError, 401, 'wrong key');
}

main().catch((e) => { fail++; console.log('FAIL exception ' + (e.stack || e)); })
  .finally(() => console.log(`client: ${pass} passed, ${fail} failed`));
