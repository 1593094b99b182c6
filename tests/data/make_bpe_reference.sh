#!/usr/bin/env bash
# Makes the GPT-2 BPE reference (vocab.json, merges.txt, tokenizer.json, reference.jsonl) that
# tests/data/test_bpe_tiktoken.cc checks onyx's BPE against, from npm's js-tiktoken (r50k_base is
# GPT-2's encoding) and WordNet glosses (Debian's wordnet-base). Run before ctest:
#   bash tests/data/make_bpe_reference.sh [BUILD_DIR]        (default: $BUILD or build)
# Output: BUILD_DIR/bpe-reference/. Without node, npm or network it prints why and exits 0; the
# test then skips with that reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-${BUILD:-build}}
OUT=$BUILD/bpe-reference
NPM=$BUILD/npm
mkdir -p "$BUILD"
if [ -f "$OUT/reference.jsonl" ] && [ "$OUT/reference.jsonl" -nt tests/data/make_bpe_reference.js ]; then
  echo "bpe reference: up to date in $OUT"
  exit 0
fi
if ! command -v node >/dev/null; then
  echo "bpe reference: skipped (node is not installed)"
  exit 0
fi
if [ ! -f "$NPM/node_modules/js-tiktoken/package.json" ]; then
  if ! command -v npm >/dev/null; then
    echo "bpe reference: skipped (npm is not installed)"
    exit 0
  fi
  if ! timeout 300 npm install --prefix "$NPM" --ignore-scripts --no-audit --no-fund js-tiktoken \
      >"$BUILD/npm-js-tiktoken.log" 2>&1; then
    echo "bpe reference: skipped (npm install js-tiktoken failed; see $BUILD/npm-js-tiktoken.log)"
    exit 0
  fi
fi
if ! node tests/data/make_bpe_reference.js "$NPM" "$OUT"; then
  echo "bpe reference: FAILED to generate (see the error above)"
  exit 1
fi
