#!/bin/bash
# go.sh - the go tool as the CNI plugin (cni/) is built, vetted and tested with it.
#
#   scripts/go.sh build|vet|test|list ARGS...     (runs in cni/: its package is ".")
#
# GOPATH mode on Debian's packaged Go libraries, no modules: bookworm's in /usr/share/gocode
# (golang-dbus-dev, golang-github-vishvananda-netlink-dev, -netns-dev) and, first, the CNI
# library that scripts/fetch-go-cni.sh unpacked (forky's golang-github-appc-cni-dev). Nothing
# is fetched here, so the build works offline and inside the .deb build. The build cache
# lives in the checkout.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v go >/dev/null \
    || { echo "[go] ERROR: go missing: run scripts/bootstrap.sh (golang-go)" >&2; exit 1; }
cni_lib=$("$ROOT/scripts/fetch-go-cni.sh" --present)
export GO111MODULE=off GOPATH=$cni_lib:/usr/share/gocode GOCACHE=$ROOT/build/go-cache CGO_ENABLED=0
cd "$ROOT/cni"
exec go "$@"
