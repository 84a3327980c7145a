// lily-server driven by the official openai npm client: plain and streamed chat,
// completions, usage, tools accepted, API errors, and many concurrent streams that must
// each equal the same request answered alone (greedy), so interleaved slots never mix.
// Usage: node server_client.mjs BASE_URL API_KEY ; prints "client: N passed, M failed".
import OpenAI from 'openai';

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;
const check = (ok, what) => { if (ok) pass++; else { fail++; console.log('FAIL ' + what); } };

const msgs = (s) => [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: s }];

async function streamText(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', finish = null, usage = null, role = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.role) role = ch.delta.role;
    if (ch.delta.content) content += ch.delta.content;
    if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { content, reasoning, finish, usage, role, chunks };
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && typeof models.data[0].id === 'string', 'models.list');
  const model = models.data[0].id;

  const p = { model, messages: msgs('Name a color.'), max_tokens: 10, temperature: 0 };
  const r1 = await client.chat.completions.create(p);
  const m1 = r1.choices[0].message;
  check(r1.object === 'chat.completion' && m1.role === 'assistant', 'chat.completions.create');
  check(r1.usage.total_tokens === r1.usage.prompt_tokens + r1.usage.completion_tokens && r1.usage.completion_tokens <= 10,
        'usage adds up');
  check(['stop', 'length'].includes(r1.choices[0].finish_reason), 'finish_reason');
  const s1 = await streamText(p);
  check(s1.role === 'assistant', 'stream starts with the role');
  check(s1.content === (m1.content ?? '') && s1.reasoning === (m1.reasoning_content ?? ''),
        `stream text equals the plain answer: ${JSON.stringify(s1)} vs ${JSON.stringify(m1)}`);
  check(s1.finish === r1.choices[0].finish_reason, 'stream finish_reason');
  check(s1.usage && s1.usage.completion_tokens === r1.usage.completion_tokens &&
        s1.usage.prompt_tokens === r1.usage.prompt_tokens, 'stream usage chunk');

  const c1 = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  check(c1.object === 'text_completion' && typeof c1.choices[0].text === 'string', 'completions.create');

  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
                   parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const rt = await client.chat.completions.create({
    model, max_tokens: 6, temperature: 0, tools, tool_choice: 'auto',
    messages: [...msgs('Weather in Paris?'),
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }],
  });
  check(rt.choices.length === 1 && rt.choices[0].message.role === 'assistant', 'tools and tool history accepted');

  try {
    await client.chat.completions.create({ model, messages: msgs('x'), n: 2 });
    check(false, 'n=2 must fail');
  } catch (e) {
    check(e.status === 400 && e.error && e.error.param === 'n', 'n=2 is a 400 APIError with param n');
  }
  try {
    await client.chat.completions.create({ model, messages: msgs('x'), temperature: 'hot' });
    check(false, 'bad temperature must fail');
  } catch (e) {
    check(e.status === 400 && e.error && e.error.type === 'invalid_request_error', 'wrong type is a 400 APIError');
  }

  // Many streams at once: three prompts, each asked alone first, then 8 times concurrently.
  const prompts = ['Tell me about rivers.', 'Count to five.', 'What is C?'];
  const refs = [];
  for (const q of prompts) {
    const r = await client.chat.completions.create({ model, messages: msgs(q), max_tokens: 12, temperature: 0 });
    refs.push(r.choices[0].message);
  }
  const jobs = [];
  for (let i = 0; i < 24; i++) {
    const k = i % 3;
    jobs.push(streamText({ model, messages: msgs(prompts[k]), max_tokens: 12, temperature: 0 }).then((s) => ({ k, s })));
  }
  const t0 = Date.now();
  const res = await Promise.allSettled(jobs);
  let same = 0, done = 0;
  for (const r of res) {
    if (r.status !== 'fulfilled') { console.log('stream failed: ' + r.reason); continue; }
    done++;
    const ref = refs[r.value.k];
    if (r.value.s.content === (ref.content ?? '') && r.value.s.reasoning === (ref.reasoning_content ?? '')) same++;
  }
  check(done === 24, `all 24 concurrent streams completed (${done})`);
  check(same === 24, `every concurrent stream equals its prompt's answer alone (${same}/24)`);
  console.log(`concurrent streams took ${Date.now() - t0} ms`);
}

main().catch((e) => { fail++; console.log('FAIL exception: ' + (e.stack || e)); })
  .finally(() => console.log(`client: ${pass} passed, ${fail} failed`));
