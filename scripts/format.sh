#!/usr/bin/env bash
# scripts/format.sh — clang-format (Debian's, style in .clang-format) over every C++ and CUDA
# source, header and .inc table in git, generated files excepted (src/tokenizers/unicode_tables.inc,
# written by tests/tokenizers/gen_unicode_tables.py). The op-case tables (tests/ops/cases_*.inc) hold one row per
# line inside `// clang-format off`.
#   bash scripts/format.sh           format in place
#   bash scripts/format.sh --check   list unformatted files, exit 1 if any (scripts/test.sh runs it)
set -uo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t FILES < <(git ls-files '*.cc' '*.h' '*.inc' '*.cu' '*.cuh' | grep -v '^src/tokenizers/unicode_tables.inc$')
else  # an exported tree without .git
  mapfile -t FILES < <(find src include tools tests bench python examples -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
    -o -name '*.inc' | grep -v '^src/tokenizers/unicode_tables.inc$' | sort)
fi
if [ "${1:-}" = --check ]; then
  bad=()
  for f in "${FILES[@]}"; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  for f in "${bad[@]}"; do echo "not formatted: $f (bash scripts/format.sh)"; done
  echo "clang-format $(clang-format --version | grep -oE '[0-9]+\.[0-9.]+' | head -1): ${#FILES[@]} files, ${#bad[@]} not formatted"
  [ ${#bad[@]} -eq 0 ]
else
  clang-format -i "${FILES[@]}"
  echo "formatted ${#FILES[@]} files"
fi
