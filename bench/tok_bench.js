// Times the Hugging Face tokenizers library (Rust, npm @anush008/tokenizers) encoding a text
// file in one call (load excluded): best of R runs. usage: node tok_bench.js TOKENIZER TEXT [RUNS]
'use strict';
const path = require('path');
const fs = require('fs');
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'npm', 'node_modules', '@anush008', 'tokenizers'));
async function main() {
  const [tokPath, textPath, runsArg] = process.argv.slice(2);
  const runs = Number(runsArg || 3);
  const tok = Tokenizer.fromFile(tokPath);
  const buf = fs.readFileSync(textPath);
  const text = buf.toString('utf8');
  let best = 1e30, first = 0, n = 0;
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    const e = await tok.encode(text, null, { addSpecialTokens: false });
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    n = e.getIds().length;
    if (r === 0) first = dt;
    best = Math.min(best, dt);
  }
  console.log(`hf-tokenizers whole: ${buf.length} bytes, ${n} tokens, first run ${first.toFixed(3)} s, best ${best.toFixed(3)} s, ${(buf.length / best / 1e6).toFixed(1)} MB/s`);
  // the same text as its blank-line-separated chunks, one encode call each (fresh tokenizer)
  const tok2 = Tokenizer.fromFile(tokPath);
  const chunks = [];
  for (let p = 0; p < buf.length;) {
    const q = buf.indexOf('\n\n', p);
    const end = q < 0 ? buf.length : q + 2;
    chunks.push(buf.subarray(p, end).toString('utf8'));
    p = end;
  }
  best = 1e30;
  let total = 0;
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    total = 0;
    for (const c of chunks) total += (await tok2.encode(c, null, { addSpecialTokens: false })).getIds().length;
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (r === 0) first = dt;
    best = Math.min(best, dt);
  }
  console.log(`hf-tokenizers chunks: ${chunks.length} texts, ${total} tokens, first run ${first.toFixed(3)} s, best ${best.toFixed(3)} s, ${(buf.length / best / 1e6).toFixed(1)} MB/s`);
}
main().catch((e) => { console.error(e); process.exit(1); });
