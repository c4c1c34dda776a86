// Reads a JSON array of JSON5 texts on stdin and writes, for each, what
// the json5 package (the reader OpenClaw uses for its config) makes of it:
// {"ok": true, "value": ...} or {"ok": false}. Numbers JSON cannot carry
// (Infinity, -Infinity, NaN) are written as their names.
const JSON5 = require(process.argv[2]);
let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((src) => {
    try {
      return { ok: true, value: JSON5.parse(src) };
    } catch (e) {
      return { ok: false };
    }
  });
  process.stdout.write(
    JSON.stringify(out, (k, v) => (typeof v === "number" && !isFinite(v) ? String(v) : v)),
  );
});
