// Test oracle for the tokenizer: the Hugging Face `tokenizers` library (Rust, via npm
// @anush008/tokenizers). Modes:
//   gen SEED N [old]      -> N random texts, one hex line each (mixed scripts, marks, emoji,
//                            whitespace runs, contractions, added-token text, invalid UTF-8)
//   genids SEED N VOCAB   -> N random id lines below VOCAB
//   encode TOKENIZER.json -> stdin hex lines -> id lines (add_special_tokens = false)
//   decode TOKENIZER.json SKIP -> stdin id lines -> hex lines of the decoded UTF-8
// Texts arrive as bytes; Buffer.toString('utf8') turns ill-formed parts into U+FFFD, which is
// exactly what the library can be given.
'use strict';
const path = require('path');
const readline = require('readline');
const { Tokenizer } = require(path.join(__dirname, '..', 'npm', 'node_modules', '@anush008', 'tokenizers'));

function rng(seed) {
  let s = BigInt(seed) | 1n;
  return () => {
    s ^= s << 13n; s &= 0xffffffffffffffffn; s ^= s >> 7n; s ^= s << 17n; s &= 0xffffffffffffffffn;
    return Number(s % 4294967296n) / 4294967296;
  };
}

const pools = [
  'abcdefghijklmnopqrstuvwxyz', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', '0123456789', '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~',
  ' ', '  ', '\t', '\n', '\r\n', '\n\n', ' \n ', '\u00a0', '\u3000', '\u2003', '\u0085', '\u180e', '\u200b', '\u2028', '\u000b\u000c',
  "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'\u017f", "'x", "''", "'",
  'àéîõüçñßøåæœÀÉÎÕÜ', 'ąęłńśźżčřšžůőű', 'αβγδεζηθλμνξπρστφχψω', 'абвгдежзийклмнопрстуфхцчшщыэюя',
  'مرحبابالعالم', 'שלוםעולם', 'नमस्तेदुनिया', 'สวัสดีครับผม', '你好世界人工智能今天天气', 'ひらがなカタカナ', 'がぱゲ',
  '한국어텍스트', '\u1100\u1161\u11a8', '\u0301', '\u0308', '\u0327', '\u20dd', '\u093f', '\u0e31', '\u3099', '\u309a',
  '\u0660\u0661\u0662', '\uff10\uff11', '\u00b2\u00bd', '\u2167\u216b', '\ud83e\udd99', '\ud83d\ude80', '\ud83d\udc4d\ud83c\udffd',
  '\ud83d\ude36\u200d\ud83c\udf2b\ufe0f', '\ud83c\uddeb\ud83c\uddf7', '\u2705', '\u2211', '\u221e', '\ufeff',
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>', '<|im_start', 'im_end|>', '<|', '|>',
  'the', ' the', 'ing', 'tion', 'def ', 'return', '    ', '\t\t', '#include', '{"a": 1}', 'http://x.y/z?q=1',
];
const markRanges = [[0x300, 0x36f], [0x591, 0x5c7], [0x610, 0x61a], [0x64b, 0x65f], [0x900, 0x97f], [0x1ab0, 0x1aff],
  [0x1dc0, 0x1dff], [0x20d0, 0x20ff], [0xfe20, 0xfe2f], [0x1100, 0x11ff], [0x3099, 0x309a], [0x0f71, 0x0f84]];
const invalid = [[0x80], [0xbf], [0xc0, 0x80], [0xc3], [0xe2, 0x82], [0xed, 0xa0, 0x80], [0xf0, 0x9f, 0x98], [0xf4, 0x90, 0x80, 0x80],
  [0xf5], [0xff], [0xe0, 0x80, 0x80], [0xc2, 0x41], [0xef, 0xbf, 0xbe]];

function gen(seed, n, old) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; i++) {
    const parts = [];
    const len = Math.floor(r() * r() * 40);
    for (let k = 0; k < len; k++) {
      const x = r();
      if (x < 0.04) parts.push(Buffer.from(invalid[Math.floor(r() * invalid.length)]));
      else if (x < 0.12) { // any code point, mostly BMP; 'old' keeps to characters Unicode 14 already had
        let cp = r() < 0.8 ? Math.floor(r() * 0xd800) : 0xe000 + Math.floor(r() * (0x30000 - 0xe000));
        if (old) { cp = Math.floor(r() * 0x2000); if (cp === 0x897 || (cp >= 0x1c80 && cp <= 0x1c8f)) cp = 0x41; }
        parts.push(Buffer.from(String.fromCodePoint(cp), 'utf8'));
      } else if (x < 0.18) { // combining marks and jamo: canonical reordering and composition
        const [lo, hi] = markRanges[Math.floor(r() * markRanges.length)];
        parts.push(Buffer.from(String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1))), 'utf8'));
      } else {
        const p = pools[Math.floor(r() * pools.length)];
        const cps = Array.from(p);
        let s = r() < 0.5 ? p : cps.slice(0, 1 + Math.floor(r() * cps.length)).join('');
        if (r() < 0.3) s = s.repeat(1 + Math.floor(r() * 5));
        parts.push(Buffer.from(s, 'utf8'));
      }
    }
    out.push(Buffer.concat(parts).toString('hex'));
  }
  return out;
}

async function lines(fn) {
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  const out = [];
  for await (const line of rl) out.push(await fn(line));
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
}

async function main() {
  const [mode, a, b, c] = process.argv.slice(2);
  if (mode === 'gen') { const g = gen(Number(a), Number(b), c === 'old'); process.stdout.write(g.join('\n') + '\n'); return; }
  if (mode === 'genids') {
    const r = rng(Number(a)), out = [];
    for (let i = 0; i < Number(b); i++) {
      const ids = [];
      const len = Math.floor(r() * 12);
      for (let k = 0; k < len; k++) ids.push(r() < 0.3 ? Math.floor(r() * 256) : Math.floor(r() * Number(c)));
      out.push(ids.join(' '));
    }
    process.stdout.write(out.join('\n') + '\n');
    return;
  }
  const tok = Tokenizer.fromFile(a);
  if (mode === 'encode') {
    await lines(async (h) => {
      const e = await tok.encode(Buffer.from(h, 'hex').toString('utf8'), null, { addSpecialTokens: false });
      return e.getIds().join(' ');
    });
  } else if (mode === 'decode') {
    const skip = b === '1';
    await lines(async (l) => {
      const ids = l.trim() ? l.trim().split(/\s+/).map(Number) : [];
      return Buffer.from(await tok.decode(ids, skip), 'utf8').toString('hex');
    });
  } else throw new Error('unknown mode ' + mode);
}
main().catch((e) => { console.error(e); process.exit(1); });
