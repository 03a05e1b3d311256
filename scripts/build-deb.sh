#!/bin/bash
# build-deb.sh - build the Debian packages (make deb) and check them with lintian.
#
#   scripts/build-deb.sh        prints the paths of build/deb/rdmad_<version>_<arch>.deb
#                               and build/deb/rdmad-dra_<version>_<arch>.deb, one a line
#
# Builds from the files the package is made of (PKG_FILES), as they are in the work tree
# (uncommitted edits included), copied to build/deb/src so the build never writes into the
# checkout. A second run with the same files is a no-op (a stamp keyed on them): editing
# tests or the other docs does not rebuild. Needs debhelper, dh-virtualenv, lintian, Go and
# Debian's Go libraries (scripts/bootstrap.sh installs them; the CNI library is the copy
# scripts/fetch-go-cni.sh unpacked, which the build reads and never fetches) and the index
# the lock's packages are on.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/build/deb
say() { echo "[deb] $*" >&2; }
die() { echo "[deb] ERROR: $*" >&2; exit 1; }

for tool in dpkg-buildpackage dh_virtualenv lintian go; do
    command -v "$tool" >/dev/null || die "$tool missing: run scripts/bootstrap.sh"
done
PKG_FILES=(pyproject.toml README.md docs/metrics.md docs/kubernetes.md rdmad systemd dbus polkit debian requirements cni
           scripts/build-cni.sh scripts/go.sh scripts/gen-proto.sh scripts/fetch-go-cni.sh
           scripts/private-apt.sh)
mkdir -p "$OUT"
src_tar=$(mktemp)
trap 'rm -f "$src_tar"' EXIT
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- "${PKG_FILES[@]}" | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf "$src_tar" --owner=0 --group=0 --mtime=@0 --sort=name)
stamp=$(sha256sum < "$src_tar" | cut -d' ' -f1)
version=$(cd "$ROOT" && dpkg-parsechangelog -S Version)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
# the binary packages of debian/control, in its order
debs=("$OUT/rdmad_${version}_$arch.deb" "$OUT/rdmad-dra_${version}_$arch.deb")
built() { local d; for d in "${debs[@]}"; do [ -f "$d" ] || return 1; done; }

if [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ] && built; then
    say "up to date: ${debs[*]}"
else
    say "building rdmad and rdmad-dra $version (log: $OUT/build.log)"
    rm -rf "$OUT/src" "$OUT"/*.deb "$OUT"/*.changes "$OUT"/*.buildinfo "$OUT/.stamp"
    mkdir -p "$OUT/src"
    tar -xmf "$src_tar" -C "$OUT/src"   # -m: files dated now, not 1970
    (cd "$OUT/src" && dpkg-buildpackage -b -us -uc) >"$OUT/build.log" 2>&1 \
        || { tail -n 40 "$OUT/build.log" >&2; die "dpkg-buildpackage failed: see $OUT/build.log"; }
    built || die "not all of ${debs[*]} after the build"
    # each override in debian/<package>.lintian-overrides says why it is there
    for deb in "${debs[@]}"; do
        lintian --fail-on error,warning --tag-display-limit 0 "$deb" >&2 \
            || die "lintian found problems in $deb"
    done
    # rdmad/dra is rdmad-dra's alone (debian/rules): none of it in rdmad's package
    dra_files() { dpkg-deb -c "$1" | grep -cE '/site-packages/rdmad/dra/|/bin/rdmad-dra$' || true; }
    [ "$(dra_files "${debs[0]}")" = 0 ] || die "${debs[0]} carries rdmad/dra, rdmad-dra's"
    [ "$(dra_files "${debs[1]}")" != 0 ] || die "${debs[1]} lacks rdmad/dra"
    echo "$stamp" > "$OUT/.stamp"
fi
printf '%s\n' "${debs[@]}"
