# shellcheck shell=bash disable=SC2034
# (SC2034: APT, MIRROR, SECMIRROR and SIGNED_BY are for the scripts that source this file)
# private-apt.sh - sourced by scripts/fetch-containerd.sh, scripts/fetch-go-cni.sh and
# tests/guest/harness/prepare-kernel.sh: fetch pinned Debian packages of another suite
# through a private apt state (own sources.list, lists, cache), so that the host's apt
# configuration and dpkg database stay untouched; apt still checks the archive's signed
# Release files. The caller defines say and die, and writes $1/sources.list.

# debian_mirrors: MIRROR and SECMIRROR, the Debian archive and its security archive as the
# host's apt sources name them (the mirror or proxy this host, and CI, can reach);
# RDMAD_DEBIAN_MIRROR / RDMAD_DEBIAN_SECURITY_MIRROR win.
debian_mirrors() {
    local uris
    uris=$(_host_apt_uris || true)
    MIRROR=${RDMAD_DEBIAN_MIRROR:-$(grep -E '/debian/?$' <<<"$uris" | head -1 || true)}
    SECMIRROR=${RDMAD_DEBIAN_SECURITY_MIRROR:-$(grep -E '/debian-security/?$' <<<"$uris" | head -1 || true)}
    [ -n "$MIRROR" ] || die "no Debian archive in the host's apt sources: set RDMAD_DEBIAN_MIRROR"
    [ -n "$SECMIRROR" ] || die "no Debian security archive in the host's apt sources: set RDMAD_DEBIAN_SECURITY_MIRROR"
}

_host_apt_uris() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822 "URIs: a b" and one-line "deb [opts] URI suite comps"
        awk '/^[[:space:]]*URIs:/ {for (i = 2; i <= NF; i++) print $i}
             /^[[:space:]]*deb[[:space:]]/ {i = 2; if ($i ~ /^\[/) {while (i <= NF && $i !~ /\]$/) i++; i++} print $i}' "$f"
    done
}

# private_apt_state DIR: DIR's lists, cache, debs/ (downloads) and x/ (unpacking); sets
# MIRROR and SECMIRROR (debian_mirrors), SIGNED_BY (the "[signed-by=...] " of a
# sources.list line, or "") and APT (apt-get/apt-cache options that read DIR/sources.list
# and nothing of the host's).
private_apt_state() {
    local st=$1 key=/usr/share/keyrings/debian-archive-keyring.gpg
    mkdir -p "$st/lists/partial" "$st/cache/archives/partial" "$st/debs" "$st/x"
    debian_mirrors
    SIGNED_BY=""; [ -r "$key" ] && SIGNED_BY="[signed-by=$key] "
    APT=(-o "Dir::Etc::SourceList=$st/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
         -o "Dir::State::Lists=$st/lists" -o "Dir::Cache=$st/cache"
         -o "Dir::State::status=/dev/null" -o APT::Sandbox::User=root
         -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o Acquire::Languages=none)
}

# private_apt_update DIR: apt-get update of the state, once DIR/sources.list is written.
private_apt_update() {
    say "apt-get update (private state: $(tr '\n' ';' < "$1/sources.list"))"
    apt-get "${APT[@]}" update -qq >&2 || die "apt-get update of the private state failed"
}

# in_archive NAME=VERSION: whether the archive still offers that version (`apt-cache show
# pkg=ver` exits 0 for an unknown version: madison's list is compared instead).
in_archive() {
    apt-cache "${APT[@]}" madison "${1%%=*}" 2>/dev/null \
        | awk -F' *[|] *' -v v="${1#*=}" '$2 == v {f = 1} END {exit !f}'
}

# fetch_unpacked PKG=VERSION OUT SUITE...: the pinned package of those suites (a SUITE
# ending in -security is read from the security archive) unpacked with `dpkg-deb -x` into
# OUT, never installed. OUT/.complete names the pin: a re-run is a no-op, and one fetcher
# runs at a time (a CI job racing a manual run; the winner's stamp ends the loser's wait).
# Fails, listing what the archive offers, when the pin is gone from it.
fetch_unpacked() {
    local pin=$1 out=$2 st s
    shift 2
    [ "$(cat "$out/.complete" 2>/dev/null)" = "$pin" ] && return 0
    [ "$(id -u)" = 0 ] || die "run as root (the cache is under $(dirname "$out"))"
    for s in apt-get apt-cache dpkg-deb flock; do
        command -v "$s" >/dev/null || die "$s missing: run scripts/bootstrap.sh on a Debian host"
    done
    mkdir -p "$(dirname "$out")"
    exec 9>"$(dirname "$out")/.lock"
    flock 9
    [ "$(cat "$out/.complete" 2>/dev/null)" = "$pin" ] && return 0
    st=$(mktemp -d "$(dirname "$out")/apt.XXXXXX")
    # shellcheck disable=SC2064 # expand now: st is local
    trap "rm -rf '$st'" EXIT
    private_apt_state "$st"
    for s in "$@"; do
        case $s in
            *-security) echo "deb ${SIGNED_BY}$SECMIRROR $s main" ;;
            *) echo "deb ${SIGNED_BY}$MIRROR $s main" ;;
        esac
    done > "$st/sources.list"
    private_apt_update "$st"
    if ! in_archive "$pin"; then
        echo "ERROR: the pinned $pin is no longer in $*; the archive offers:" >&2
        apt-cache "${APT[@]}" madison "${pin%%=*}" 2>/dev/null | sed 's/^/    /' >&2
        die "bump the pin in $(basename "$0"), run it again, then the tests that use it"
    fi
    say "fetching $pin"
    (cd "$st/debs" && apt-get "${APT[@]}" download "$pin" >&2) || die "apt-get download $pin failed"
    dpkg-deb -x "$st"/debs/*.deb "$st/x"
    rm -rf "$out"
    mv "$st/x" "$out"
    echo "$pin" > "$out/.complete"
    say "unpacked into $out"
}
