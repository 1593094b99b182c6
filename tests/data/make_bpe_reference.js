// make_bpe_reference.js — GPT-2 BPE reference data from js-tiktoken's r50k_base (GPT-2's encoding),
// for tests/data/test_bpe_tiktoken.cc. Run by make_bpe_reference.sh:
//   node tests/data/make_bpe_reference.js NPM_PREFIX OUT_DIR
// Writes to OUT_DIR:
//   vocab.json, merges.txt, tokenizer.json  the ranks as a Hugging Face byte-level BPE vocabulary
//                                          (token string -> id = rank) with merges derived from them
//   reference.jsonl                        {"text": ..., "ids": [...]} per line, ids from js-tiktoken
// Merges come from the ranks as in the usual tiktoken -> Hugging Face conversion: a token of rank r
// and two or more bytes is the merge of the two parts that BPE over its bytes, using only ranks
// below r, ends with; merges are listed in rank order.
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const [npmPrefix, outDir] = process.argv.slice(2);
if (!npmPrefix || !outDir) {
  console.error("usage: node make_bpe_reference.js NPM_PREFIX OUT_DIR");
  process.exit(2);
}
const req = createRequire(path.resolve(npmPrefix, "package.json"));
const { Tiktoken } = req("js-tiktoken/lite");
const r50k = req("js-tiktoken/ranks/r50k_base");
const ranksData = r50k.default || r50k;

// ---- ranks: base64 token -> rank, as js-tiktoken reads its compressed bpe_ranks ----
const tokenBytes = []; // rank -> Buffer
for (const line of ranksData.bpe_ranks.split("\n").filter(Boolean)) {
  const [, offsetStr, ...tokens] = line.split(" ");
  const offset = Number.parseInt(offsetStr, 10);
  tokens.forEach((t, i) => (tokenBytes[offset + i] = Buffer.from(t, "base64")));
}
const rankOf = new Map(); // "b1,b2,..." -> rank
tokenBytes.forEach((b, r) => rankOf.set(Array.from(b).join(","), r));

// ---- GPT-2's bytes_to_unicode ----
const byteToChar = [];
{
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteToChar[b] = String.fromCodePoint(printable ? b : 256 + extra++);
  }
}
const toUnicode = (buf) => Array.from(buf, (b) => byteToChar[b]).join("");

// ---- merges: BPE over a token's bytes with ranks below its own ----
function partsBelow(buf, maxRank) {
  let parts = Array.from(buf, (b) => [b]);
  while (parts.length > 1) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = rankOf.get(parts[i].concat(parts[i + 1]).join(","));
      if (r !== undefined && r < maxRank && r < bestRank) {
        bestRank = r;
        best = i;
      }
    }
    if (best < 0) break;
    parts.splice(best, 2, parts[best].concat(parts[best + 1]));
  }
  return parts;
}

const vocab = {};
const merges = [];
tokenBytes.forEach((buf, rank) => {
  vocab[toUnicode(buf)] = rank;
  if (buf.length < 2) return;
  const parts = partsBelow(buf, rank);
  if (parts.length !== 2) throw new Error(`token ${rank} does not split into two lower-ranked parts`);
  merges.push(toUnicode(Buffer.from(parts[0])) + " " + toUnicode(Buffer.from(parts[1])));
});
for (const [tok, id] of Object.entries(ranksData.special_tokens)) vocab[tok] = id;

// ---- texts: WordNet glosses, some joined with line breaks, and hand-written Unicode lines ----
const texts = [];
for (const pos of ["noun", "verb", "adj", "adv"]) {
  const file = `/usr/share/wordnet/data.${pos}`;
  if (!fs.existsSync(file)) continue;
  const glosses = fs
    .readFileSync(file, "latin1")
    .split("\n")
    .filter((l) => l && !l.startsWith("  ") && l.includes("| "))
    .map((l) => l.slice(l.indexOf("| ") + 2));
  const want = 1000;
  const step = Math.max(1, Math.floor(glosses.length / want));
  for (let i = 0; i < glosses.length && texts.length < 1000000; i += step) {
    texts.push(glosses[i]);
    if ((i / step) % 20 === 7 && i + 2 < glosses.length)
      texts.push(glosses[i] + "\n" + glosses[i + 1] + "\n\n  " + glosses[i + 2]);
  }
}
const handwritten = [
  "I'm sure they'll say it's fine, don't you think? We've been told you'd LOVE it.",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE ' s a's b'll",
  "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "我爱自然语言处理。東京は日本の首都です。서울은 한국의 수도입니다.",
  "Café naïve résumé Ærøskøbing Łódź São Paulo Zürich İstanbul ĞÜŞ",
  "1234567 3.14159 1,000,000 ٣٤٥ ⅔ x² 10km 2024-01-01T12:00:00Z",
  "emoji 😀 👍🏽 🇩🇪 and symbols ©®™ ±×÷ ∑∫√ → ← ⇒",
  "tabs\there\t\tand  double  spaces   triple   ",
  "   leading spaces and trailing newline\n",
  "line one\nline two\r\nline three\n\n\nafter blank lines",
  "non-breaking\u00a0space and ideographic\u3000space",
  "mixed123abc 456def ghi789 a1b2c3",
  "URLs: https://example.com/path?q=1&r=2#frag e-mail: someone@example.org",
  "code: for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // done",
  "quotes \"double\" 'single' «guillemets» „low“ ‘curly’ “curly”",
  "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
  "",
  " ",
  "\n",
  "a",
  "  \n  x",
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
  "ÀÁÂÃÄÅàáâãäå ÈÉÊËèéêë ÌÍÎÏìíîï ÒÓÔÕÖòóôõö ÙÚÛÜùúûü Ññ Çç",
  "Ελληνικά: Αθήνα, Θεσσαλονίκη· Русский: Москва, Санкт-Петербург",
];
texts.push(...handwritten);

const enc = new Tiktoken(ranksData);
const lines = texts.map((text) => JSON.stringify({ text, ids: enc.encode(text) }));

// ---- write, into a temporary folder renamed at the end ----
const tmp = outDir + ".tmp";
fs.rmSync(tmp, { recursive: true, force: true });
fs.mkdirSync(tmp, { recursive: true });
fs.writeFileSync(path.join(tmp, "vocab.json"), JSON.stringify(vocab));
fs.writeFileSync(path.join(tmp, "merges.txt"), "#version: 0.2\n" + merges.join("\n") + "\n");
const special = Object.entries(ranksData.special_tokens).map(([content, id]) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true,
}));
const tokenizerJson = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: special,
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
    fuse_unk: false, byte_fallback: false, vocab, merges,
  },
};
fs.writeFileSync(path.join(tmp, "tokenizer.json"), JSON.stringify(tokenizerJson));
fs.writeFileSync(path.join(tmp, "reference.jsonl"), lines.join("\n") + "\n");
fs.rmSync(outDir, { recursive: true, force: true });
fs.renameSync(tmp, outDir);
console.log(`bpe reference: ${Object.keys(vocab).length} tokens, ${merges.length} merges, ${texts.length} texts -> ${outDir}`);
