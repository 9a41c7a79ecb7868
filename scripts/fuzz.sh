#!/usr/bin/env bash
# fuzz.sh - run every go fuzz target in the module for a while each.
# usage: scripts/fuzz.sh [FUZZTIME]   (default 30s per target)
set -euo pipefail
t=${1:-30s}
cd "$(dirname "$0")/.."
found=0
for pkg in $(go list ./...); do
  for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    found=1
    echo "== $pkg $f ($t)"
    go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$pkg"
  done
done
[ "$found" = 1 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
