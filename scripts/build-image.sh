#!/bin/bash
# build-image.sh - the OCI image of rdmad-dra (make image), from the project's own .debs.
#
#   scripts/build-image.sh           prints the path of build/image/rdmad-dra.oci.tar, an
#                                    OCI image layout in a tar (`ctr images import` reads it)
#                                    naming the image localhost/rdmad-dra:<version>
#   scripts/build-image.sh --check   the same, and beside it one more build, apart; fails
#                                    unless the two archives are the same bytes
#
# No registry can be reached, so there is no base image: mmdebstrap makes a minimal
# bookworm (its Essential packages) from Debian's archive, as the host's apt sources name it
# (scripts/private-apt.sh), installs rdmad and rdmad-dra from the .debs scripts/build-deb.sh
# built and, through apt, what they depend on; no docs, man pages or locales. That tree is
# the image's one layer. SOURCE_DATE_EPOCH (default: debian/changelog's date) dates every
# file and the image config; the tar is sorted, with numeric owners and no atime or ctime;
# gzip keeps no name or time. So the same .debs and the same archive give the same digest.
# A second run with the same .debs and this script is a no-op (a stamp keyed on them).
# Needs root (mmdebstrap's root mode), mmdebstrap, jq.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/build/image
ARCHIVE=$OUT/rdmad-dra.oci.tar
say() { echo "[image] $*" >&2; }
die() { echo "[image] ERROR: $*" >&2; exit 1; }
# shellcheck source=./private-apt.sh source-path=SCRIPTDIR
. "$ROOT/scripts/private-apt.sh"

check=no
case ${1:-} in
    "") ;;
    --check) check=yes ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1" ;;
esac
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap's root mode)"
for tool in mmdebstrap jq gzip sha256sum; do
    command -v "$tool" >/dev/null || die "$tool missing: run scripts/bootstrap.sh"
done

mapfile -t debs < <("$ROOT/scripts/build-deb.sh")
[ "${#debs[@]}" = 2 ] || die "scripts/build-deb.sh gave no .debs"
version=$(cd "$ROOT" && dpkg-parsechangelog -S Version)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(cd "$ROOT" && dpkg-parsechangelog -S Timestamp)}
export SOURCE_DATE_EPOCH
REFERENCE=localhost/rdmad-dra:$version
stamp=$(cat "${BASH_SOURCE[0]}" "${debs[@]}" | sha256sum | cut -d' ' -f1)-$SOURCE_DATE_EPOCH

# rootfs DIR: the image's tree in DIR (mmdebstrap, bookworm's Essential set, the .debs).
rootfs() {
    debian_mirrors
    local opts=() p
    for p in "${debs[@]}"; do opts+=(--include="$p"); done
    mmdebstrap --mode=root --variant=essential --format=directory "${opts[@]}" \
        --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
        --customize-hook='cd "$1" && rm -rf var/cache/* var/lib/apt/lists/* usr/share/doc/* \
            usr/share/man/* usr/share/info/* usr/share/locale/* usr/share/lintian/*' \
        bookworm "$1" \
        "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
        "deb $SECMIRROR bookworm-security main" >&2
}

# blob FILE MEDIATYPE: FILE moved into the layout's blobs; prints its descriptor.
blob() {
    local digest size
    digest=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$layout/blobs/sha256/$digest"
    jq -cn --arg t "$2" --arg d "sha256:$digest" --argjson s "$size" \
        '{mediaType: $t, digest: $d, size: $s}'
}

# build ARCHIVE: the image, written to ARCHIVE.
build() {
    local work layout tree diff_id layer config manifest
    work=$(mktemp -d "$OUT/work.XXXXXX")
    # shellcheck disable=SC2064 # expand now: work is local
    trap "rm -rf '$work'" EXIT
    tree=$work/rootfs layout=$work/layout
    mkdir -p "$layout/blobs/sha256"
    say "mmdebstrap bookworm + ${debs[*]##*/} (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
    rootfs "$tree"
    # /dev: the runtime makes it (a tmpfs with the container's devices)
    tar --sort=name --numeric-owner --format=pax --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime \
        --exclude=./dev/* --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
        -C "$tree" -cf "$work/layer.tar" .
    diff_id=sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
    gzip -n -6 "$work/layer.tar"
    layer=$(blob "$work/layer.tar.gz" application/vnd.oci.image.layer.v1.tar+gzip)
    jq -cn --arg d "$diff_id" --arg created "$(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ)" '{
        architecture: "amd64", os: "linux", created: $created,
        config: {Entrypoint: ["/usr/bin/rdmad-dra"],
                 Env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        rootfs: {type: "layers", diff_ids: [$d]}}' > "$work/config.json"
    config=$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)
    jq -cn --argjson c "$config" --argjson l "$layer" '{schemaVersion: 2,
        mediaType: "application/vnd.oci.image.manifest.v1+json", config: $c, layers: [$l]}' \
        > "$work/manifest.json"
    manifest=$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)
    jq -cn --argjson m "$manifest" --arg ref "$REFERENCE" '{schemaVersion: 2,
        mediaType: "application/vnd.oci.image.index.v1+json",
        manifests: [$m + {annotations: {"io.containerd.image.name": $ref,
                                        "org.opencontainers.image.ref.name": ($ref | sub(".*:"; ""))}}]}' \
        > "$layout/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
    tar --sort=name --numeric-owner --owner=0 --group=0 --mtime="@$SOURCE_DATE_EPOCH" \
        --format=pax --pax-option=delete=atime,delete=ctime -C "$layout" -cf "$1.new" .
    mv "$1.new" "$1"
    rm -rf "$work"
    trap - EXIT
}

mkdir -p "$OUT"
if [ "$check" = yes ]; then
    # the second build, apart, beside the first (each keeps about one core busy)
    again=$OUT/check.oci.tar
    build "$again" >"$again.log" 2>&1 &
    second_build=$!
fi
if [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$ARCHIVE" ]; then
    say "up to date: $ARCHIVE"
else
    rm -f "$OUT/.stamp"
    build "$ARCHIVE"
    echo "$stamp" > "$OUT/.stamp"
    say "$REFERENCE: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
fi
if [ "$check" = yes ]; then
    wait "$second_build" || { cat "$again.log" >&2; die "the second build failed"; }
    first=$(sha256sum < "$ARCHIVE" | cut -d' ' -f1) second=$(sha256sum < "$again" | cut -d' ' -f1)
    [ "$first" = "$second" ] \
        || die "not reproducible: $ARCHIVE is sha256:$first, a second build sha256:$second (kept: $again)"
    rm -f "$again" "$again.log"
    say "reproducible: two builds are sha256:$first"
fi
echo "$ARCHIVE"
