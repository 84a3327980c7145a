// lily-server's /v1/responses driven by the official openai client: responses.create,
// responses.stream (events and finalResponse) and stream: true, greedy determinism,
// instructions, previous_response_id reusing the cache, function tools (a forced call, then
// a function_call_output round trip), text.format json_schema through responses.parse,
// retrieve / inputItems / delete, and API errors as the SDK's typed errors.
// Usage: node responses_client.mjs BASE_URL API_KEY ; prints "client: N passed, M failed".
import OpenAI from 'openai';

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;
const check = (ok, what) => { if (ok) pass++; else { fail++; console.log('FAIL ' + what); } };
const draw = () => ['apple', 'river', 'stone', 'cloud'][Math.floor(Math.random() * 4)] + ' ' + Math.floor(Math.random() * 1000);
let word = draw();
const J = (x) => JSON.stringify(x).slice(0, 600);

async function main() {
  const ask = () => ({ model: 'lily', max_output_tokens: 10, temperature: 0, reasoning: { effort: 'none' }, input: 'Name ' + word });
  let p = ask(), r1 = await client.responses.create(p);
  // a few prompts make the random-weight model end within 10 tokens: these checks want a cut-off answer
  for (let i = 0; i < 6 && r1.status !== 'incomplete'; i++) { word = draw(); p = ask(); r1 = await client.responses.create(p); }
  check(r1.object === 'response' && r1.id.startsWith('resp_') && r1.status === 'incomplete' &&
        r1.incomplete_details?.reason === 'max_output_tokens', 'create: shape ' + J(r1));
  const u = r1.usage;
  check(u.output_tokens === 10 && u.total_tokens === u.input_tokens + u.output_tokens &&
        u.input_tokens_details.cached_tokens >= 0 && u.output_tokens_details.reasoning_tokens === 0, 'usage adds up ' + J(u));
  check(typeof r1.output_text === 'string' && r1.output_text.length > 0, 'output_text ' + J(r1.output));
  const r2 = await client.responses.create(p);
  check(r2.output_text === r1.output_text && r2.id !== r1.id, 'greedy: same text twice, new id');

  // the SDK's stream helper folds the events into the same answer
  const s = client.responses.stream(p);
  let deltas = '', events = 0, lastSeq = -1, ordered = true;
  s.on('response.output_text.delta', (e) => { deltas += e.delta; });
  s.on('event', (e) => { events++; ordered &&= e.sequence_number === lastSeq + 1; lastSeq = e.sequence_number; });
  const fin = await s.finalResponse();
  // an incomplete answer: the SDK folds the events itself (it takes the server's object only
  // from response.completed), so compare the folded message text
  const finText = fin.output.filter((o) => o.type === 'message').map((o) => o.content[0].text).join('');
  check(deltas === r1.output_text && finText === r1.output_text && ordered && events > 6,
        `stream helper: '${deltas}' vs '${r1.output_text}', ${events} events, ordered ${ordered}`);
  const raw = await client.responses.create({ ...p, stream: true });
  const types = [];
  let last = null;
  for await (const ev of raw) { types.push(ev.type); last = ev; }
  check(types[0] === 'response.created' && types.includes('response.output_text.delta') && types.at(-1) === 'response.incomplete' &&
        last.response.output_text === r1.output_text && last.response.usage.output_tokens === 10, 'stream: true events ' + types.join(','));

  // instructions: counted and echoed
  const ri = await client.responses.create({ ...p, max_output_tokens: 1, instructions: 'You are terse, ' + word });
  check(ri.usage.input_tokens > r1.usage.input_tokens && ri.instructions.startsWith('You are terse'), 'instructions ' + J(ri.usage));

  // a conversation through previous_response_id: the second turn's prefix is cached
  const t1 = await client.responses.create({ ...p, instructions: 'Be helpful.', input: 'Tell me about ' + word + ' and the sea.' });
  const t2 = await client.responses.create({ ...p, instructions: 'Be helpful.', previous_response_id: t1.id, input: 'More, please.' });
  check(t2.previous_response_id === t1.id && t2.usage.input_tokens_details.cached_tokens > 0 &&
        t2.usage.input_tokens > t1.usage.input_tokens + t1.usage.output_tokens, 'previous_response_id ' + J(t2.usage));
  let t3 = null;
  for await (const ev of await client.responses.create({ ...p, instructions: 'Be helpful.', previous_response_id: t2.id, input: 'Thanks.', stream: true }))
    if (ev.type === 'response.incomplete' || ev.type === 'response.completed') t3 = ev.response;
  check(t3 && t3.usage.input_tokens_details.cached_tokens > t2.usage.input_tokens_details.cached_tokens,
        'streamed third turn reuses more ' + J(t3?.usage));

  // function tools (decoded under the tools' grammar): a forced call, then its output sent back
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city', strict: true,
                   parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'], additionalProperties: false } }];
  const q = 'Weather in ' + word + '?';
  const forced = { ...p, max_output_tokens: 200, tools, parallel_tool_calls: false, tool_choice: { type: 'function', name: 'get_weather' }, input: q };
  const f = await client.responses.create(forced);
  const call = f.output.find((o) => o.type === 'function_call');
  check(f.status === 'completed' && f.output.length === 1 && call && call.name === 'get_weather' && call.call_id.startsWith('call_') &&
        ['Paris', 'Oslo'].includes(JSON.parse(call.arguments).city), 'forced call ' + J(f.output));
  // streamed through the helper: the arguments events and the final item agree
  const fs = client.responses.stream(forced);
  let argDeltas = '', argsDone = null;
  fs.on('response.function_call_arguments.delta', (e) => { argDeltas += e.delta; });
  fs.on('response.function_call_arguments.done', (e) => { argsDone = e.arguments; });
  const ff = await fs.finalResponse();
  const fcall = ff.output.find((o) => o.type === 'function_call');
  check(ff.status === 'completed' && fcall && argDeltas === call?.arguments && argsDone === argDeltas && fcall.arguments === argDeltas,
        'forced call streamed ' + J(ff.output));
  // its output, continued through previous_response_id: the prefix comes from the cache
  const rt2 = await client.responses.create({ ...p, max_output_tokens: 2, tools, previous_response_id: f.id,
    input: [{ type: 'function_call_output', call_id: call?.call_id ?? 'call_x', output: 'sunny' }] });
  check(rt2.usage.input_tokens_details.cached_tokens > 0 && rt2.usage.input_tokens > f.usage.input_tokens, 'tool turn 2 ' + J(rt2.usage));
  // the whole round trip sent as items
  const rt = await client.responses.create({ ...p, max_output_tokens: 4, tools, input: [
    { role: 'user', content: q }, { type: 'function_call', call_id: call?.call_id ?? 'call_x', name: 'get_weather', arguments: call?.arguments ?? '{}' },
    { type: 'function_call_output', call_id: call?.call_id ?? 'call_x', output: 'rain, 12 C, ' + word }] });
  const base1 = await client.responses.create({ ...p, max_output_tokens: 1, tools, input: q });
  check(rt.status !== 'failed' && rt.usage.input_tokens > base1.usage.input_tokens + 10, 'round trip ' + J(rt.usage));

  // text.format json_schema through responses.parse: output_parsed is the validated JSON
  const schema = { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] }, n: { type: 'integer' } },
                   required: ['color', 'n'], additionalProperties: false };
  const js = await client.responses.parse({ model: 'lily', temperature: 0.8, seed: 11, reasoning: { effort: 'minimal' }, max_output_tokens: 200,
    input: 'A color, please.', text: { format: { type: 'json_schema', name: 'pick', schema, strict: true } } });
  check(js.status === 'completed' && js.output_parsed && ['red', 'green', 'blue'].includes(js.output_parsed.color) &&
        Number.isInteger(js.output_parsed.n), 'json_schema ' + js.output_text);
  // a finished answer streamed: the helper's final response is the server's completed object
  const jsf = await client.responses.stream({ model: 'lily', temperature: 0.8, seed: 11, reasoning: { effort: 'minimal' }, max_output_tokens: 200,
    input: 'A color, please.', text: { format: { type: 'json_schema', name: 'pick', schema, strict: true } } }).finalResponse();
  check(jsf.status === 'completed' && jsf.output_text === js.output_text && jsf.usage.output_tokens === js.usage.output_tokens,
        'json_schema streamed ' + jsf.output_text);

  // stored responses
  const got = await client.responses.retrieve(t1.id);
  check(got.id === t1.id && got.output_text === t1.output_text, 'retrieve ' + J(got));
  const items = await client.responses.inputItems.list(t2.id);
  check(items.data.length === 3 && items.data[0].content === 'More, please.' && items.data[1].type === 'message' &&
        items.data[1].role === 'assistant' && items.data[2].content.startsWith('Tell me about'), 'inputItems ' + J(items.data));
  await client.responses.delete(t1.id);
  const expectErr = async (fn, cls, status, what) => {
    try { await fn(); check(false, what + ': no error'); }
    catch (e) { check(e instanceof cls && e.status === status && e.error?.message, what + ': ' + e); return e; }
  };
  await expectErr(() => client.responses.retrieve(t1.id), OpenAI.NotFoundError, 404, 'retrieve deleted');
  const e1 = await expectErr(() => client.responses.create({ ...p, previous_response_id: t1.id, input: 'x' }), OpenAI.BadRequestError, 400,
                             'previous_response_id deleted');
  check(e1?.param === 'previous_response_id' && e1?.code === 'previous_response_not_found', 'param ' + e1?.param + ' code ' + e1?.code);
  const e2 = await expectErr(() => client.responses.create({ ...p, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png', detail: 'auto' }] }] }),
                             OpenAI.BadRequestError, 400, 'input_image');
  check(e2?.param === 'input' && /input_image/.test(e2?.message), 'image param ' + e2?.param);
  const e3 = await expectErr(() => client.responses.create({ ...p, tools: [{ type: 'web_search' }] }), OpenAI.BadRequestError, 400, 'web_search tool');
  check(e3?.param === 'tools', 'web_search param ' + e3?.param);
  const wrong = new OpenAI({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
  await expectErr(() => wrong.responses.create(p), OpenAI.AuthenticationError, 401, 'wrong key');
}

main().catch((e) => { fail++; console.log('FAIL exception ' + (e.stack || e)); })
  .finally(() => console.log(`client: ${pass} passed, ${fail} failed`));
