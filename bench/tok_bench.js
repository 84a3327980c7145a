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
  console.log(`hf-tokenizers: ${buf.length} bytes, ${n} tokens, first run ${first.toFixed(3)} s, best ${best.toFixed(3)} s, ${(buf.length / best / 1e6).toFixed(1)} MB/s`);
}
main().catch((e) => { console.error(e); process.exit(1); });
