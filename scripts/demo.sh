#!/usr/bin/env bash
# The main job until the trainer lands: builds onyx, exports a small GPT-2-style model from
# Debian's PyTorch to ONNX, runs it with `onyx run`, and compares the logits with PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
OUT=${OUT:-build/demo}
mkdir -p "$OUT"
/usr/bin/python3 examples/export_demo_model.py "$OUT"
./build/onyx info "$OUT/model.onnx" | head -20
time ./build/onyx run "$OUT/model.onnx" --inputs "$OUT/inputs.safetensors" --output "$OUT/outputs.safetensors"
/usr/bin/python3 examples/export_demo_model.py "$OUT" --check
