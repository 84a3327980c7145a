// response_format on the real server, through the official openai client, validated by
// ajv (an independent JSON schema validator). The model has random weights, so whatever
// valid JSON comes out is the grammar's doing: every answer that ends with
// finish_reason "stop" must parse and validate, for greedy and for sampled decoding.
// Schemas bound every string, array and number so that the answers do end.
// Usage: node format_client.mjs BASE_URL [ROUNDS] ; prints "format: N passed, M failed".
import OpenAI from 'openai';
import Ajv from 'ajv';

const [base, roundsArg] = process.argv.slice(2);
const rounds = Number(roundsArg || 4);
const client = new OpenAI({ baseURL: base, apiKey: 'none', maxRetries: 0, timeout: 300000 });
const ajv = new Ajv({ strict: false });
let pass = 0, fail = 0;
const check = (ok, what) => { if (ok) pass++; else { fail++; console.log('FAIL ' + what); } };

const str = (n) => ({ type: 'string', maxLength: n });
const schemas = {
  flat: {
    type: 'object',
    properties: { name: str(6), age: { type: 'integer' }, ok: { type: 'boolean' } },
    required: ['name', 'age', 'ok'], additionalProperties: false,
  },
  optional: {
    type: 'object',
    properties: { a: { type: 'boolean' }, b: { type: 'null' }, c: { enum: ['x', 'y', 3, null] }, d: { type: 'integer' } },
    required: ['c'],
  },
  nested: {
    type: 'object',
    properties: {
      user: { type: 'object', properties: { id: { type: 'integer' }, tags: { type: 'array', items: str(4), maxItems: 3 } },
              required: ['id', 'tags'] },
      score: { type: 'number' },
      mode: { const: 'fast' },
    },
    required: ['user', 'mode'],
  },
  anyof: {
    type: 'array', minItems: 1, maxItems: 4,
    items: { anyOf: [{ type: 'integer' }, { type: 'boolean' }, { type: 'object', properties: { k: str(3) }, required: ['k'] }] },
  },
  recursive: {
    $defs: { node: { type: 'object', properties: { v: { type: 'integer' }, kids: { type: 'array', maxItems: 2, items: { $ref: '#/$defs/node' } } },
                     required: ['v'] } },
    $ref: '#/$defs/node',
  },
  nullable: { type: ['string', 'null'], maxLength: 5 },
};

function fmt(name) { return { type: 'json_schema', json_schema: { name, schema: schemas[name], strict: true } }; }

async function one(model, name, temperature, seed, stream) {
  const p = {
    model, messages: [{ role: 'user', content: `Give me a ${name} JSON value.` }], max_tokens: 400,
    temperature, seed, response_format: fmt(name), chat_template_kwargs: { enable_thinking: false },
  };
  if (!stream) {
    const r = await client.chat.completions.create(p);
    return { content: r.choices[0].message.content ?? '', finish: r.choices[0].finish_reason };
  }
  const s = await client.chat.completions.create({ ...p, stream: true });
  let content = '', finish = null;
  for await (const c of s) {
    const ch = c.choices[0];
    if (ch?.delta?.content) content += ch.delta.content;
    if (ch?.finish_reason) finish = ch.finish_reason;
  }
  return { content, finish };
}

async function main() {
  const model = (await client.models.list()).data[0].id;
  let stopped = 0, total = 0;
  for (const name of Object.keys(schemas)) {
    const validate = ajv.compile(schemas[name]);
    const greedy = await one(model, name, 0, 1, false);
    const greedyStream = await one(model, name, 0, 1, true);
    check(greedy.content === greedyStream.content && greedy.finish === greedyStream.finish,
          `${name}: greedy streamed equals greedy (${JSON.stringify(greedy)} vs ${JSON.stringify(greedyStream)})`);
    for (let i = 0; i < rounds; i++) {
      const r = i === 0 ? greedy : await one(model, name, 1.0, 1000 + i, i % 2 === 1);
      total++;
      if (r.finish !== 'stop') { check(r.finish === 'length', `${name}: finish ${r.finish}`); continue; }
      stopped++;
      let v, parsed = true;
      try { v = JSON.parse(r.content); } catch (e) { parsed = false; }
      check(parsed, `${name}: answer parses as JSON: ${JSON.stringify(r.content)}`);
      if (parsed) check(validate(v), `${name}: ${r.content} validates: ${ajv.errorsText(validate.errors)}`);
    }
  }
  // every schema above is bounded, so nearly every answer must have ended on its own
  check(stopped >= total - 2, `answers ended by the grammar: ${stopped} of ${total}`);

  // json_object: any object; random weights may run long inside a string, so only the
  // finished ones are parsed
  const jo = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 60, temperature: 0,
    response_format: { type: 'json_object' }, chat_template_kwargs: { enable_thinking: false },
  });
  const jc = jo.choices[0].message.content ?? '';
  check(/^\s*\{/.test(jc), `json_object starts an object: ${JSON.stringify(jc)}`);
  if (jo.choices[0].finish_reason === 'stop') {
    let ok = true;
    try { ok = typeof JSON.parse(jc) === 'object'; } catch (e) { ok = false; }
    check(ok, `json_object parses: ${jc}`);
  }

  // refusals: 400 naming response_format
  const bad = async (rf, what) => {
    try {
      await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 2, response_format: rf });
      check(false, `${what}: accepted`);
    } catch (e) {
      check(e.status === 400 && e.param === 'response_format', `${what}: 400 response_format (got ${e.status} ${e.param} ${e.message})`);
    }
  };
  await bad({ type: 'json_schema', json_schema: { name: 'p', schema: { type: 'string', pattern: '^a+$' } } }, 'pattern');
  await bad({ type: 'json_schema', json_schema: { name: 'p', schema: { type: 'integer', minimum: 3 } } }, 'minimum');
  await bad({ type: 'json_schema', json_schema: { name: 'p' } }, 'no schema');
  await bad({ type: 'xml' }, 'unknown type');
  await bad({ type: 'json_schema', json_schema: { name: 'p', schema: { $ref: '#/$defs/missing' } } }, 'dangling $ref');
  console.log(`format: ${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}
main().catch((e) => { console.log('FAIL exception ' + (e.stack || e)); console.log(`format: ${pass} passed, ${fail + 1} failed`); process.exit(1); });
