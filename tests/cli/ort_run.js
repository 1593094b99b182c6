// ort_run.js — runs an .onnx model with ONNX Runtime (onnxruntime-node, CPU) for the CLI tests.
//
// Usage: node tests/cli/ort_run.js MODEL.onnx INPUTS.json OUTPUTS.json
// INPUTS.json:  {"name": {"type": "float32" | "int64" | "int32" | "bool" | ..., "dims": [..],
//                         "data": [flat row-major values]}, ...}
// OUTPUTS.json: the same form, one entry per graph output.
// onnxruntime-node is looked up in $ORT_NODE_MODULES, else <repo>/build/npm/node_modules
// (installed there by `npm install --prefix build/npm --ignore-scripts onnxruntime-node`).
// Exits 2 when onnxruntime-node cannot be loaded, 1 when the model fails to load or run.
'use strict';
const fs = require('fs');
const path = require('path');

const modulesDir = process.env.ORT_NODE_MODULES ||
    path.join(__dirname, '..', '..', 'build', 'npm', 'node_modules');
let ort;
try {
  ort = require(path.join(modulesDir, 'onnxruntime-node'));
} catch (e) {
  process.stderr.write(`ort_run: cannot load onnxruntime-node from ${modulesDir}: ${e.message}\n`);
  process.exit(2);
}

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int32: Int32Array, int64: BigInt64Array,
  int8: Int8Array, uint8: Uint8Array, int16: Int16Array, uint16: Uint16Array,
  uint64: BigUint64Array, bool: Uint8Array,
};

function toTensor(name, spec) {
  const Arr = ARRAYS[spec.type];
  if (!Arr) throw new Error(`input '${name}': unsupported type '${spec.type}'`);
  const data = (spec.type === 'int64' || spec.type === 'uint64')
      ? Arr.from(spec.data, (v) => BigInt(v))
      : Arr.from(spec.data);
  return new ort.Tensor(spec.type, data, spec.dims);
}

function fromTensor(t) {
  // Number(float32) is exact, and JSON keeps a double's shortest round-trip form: no rounding.
  return {type: t.type, dims: Array.from(t.dims), data: Array.from(t.data, (v) => Number(v))};
}

async function main() {
  const [modelPath, inPath, outPath] = process.argv.slice(2);
  if (!outPath) {
    process.stderr.write('usage: node ort_run.js MODEL.onnx INPUTS.json OUTPUTS.json\n');
    process.exit(1);
  }
  const specs = JSON.parse(fs.readFileSync(inPath, 'utf8'));
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1,
  });
  const feeds = {};
  for (const name of session.inputNames) {
    if (!(name in specs)) throw new Error(`the model's input '${name}' is not in ${inPath}`);
    feeds[name] = toTensor(name, specs[name]);
  }
  const results = await session.run(feeds);
  const out = {};
  for (const name of session.outputNames) out[name] = fromTensor(results[name]);
  fs.writeFileSync(outPath, JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(`ort_run: ${e.message}\n`);
  process.exit(1);
});
