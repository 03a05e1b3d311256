#!/bin/bash
# build-cni.sh - build the CNI plugin rdmad-cni (Go, cni/) into one static binary.
#
#   scripts/build-cni.sh [OUT]      default OUT: build/cni/rdmad-cni (what tests and bench run)
#
# Go, not Python: a runtime starts one plugin process per pod start and stop, and CPython's
# start plus its imports alone exceeded the ADD latency budget (docs/cni.md). Built from
# Debian's Go libraries in GOPATH mode (scripts/go.sh), offline; CGO off: a static binary,
# no C toolchain. A second run with nothing changed is a quick no-op (Go's build cache).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/build/cni/rdmad-cni}")
say() { echo "[cni] $*" >&2; }
die() { echo "[cni] ERROR: $*" >&2; exit 1; }

compgen -G "$ROOT/cni/*.go" >/dev/null || die "no Go sources in $ROOT/cni"
mkdir -p "$(dirname "$OUT")"
"$ROOT/scripts/go.sh" build -trimpath -o "$OUT" . || die "go build failed"
say "built $OUT"
