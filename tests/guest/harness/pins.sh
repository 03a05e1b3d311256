# shellcheck shell=bash disable=SC2034
# (SC2034: the variables are used by the scripts that source this file)
# Pinned guest kernels and tools: sourced by prepare-kernel.sh and run-in-guest.sh.
# To bump the 6.1 pin: `apt-cache show linux-image-amd64` (bookworm / bookworm-security)
# names the current linux-image-6.1.0-NN-amd64 and its version; put both here.
# Changing a pin makes prepare-kernel.sh re-fetch that kernel (the cache is keyed on it).

# bookworm: rxe exists but cannot change netns (EOPNOTSUPP) - see design/kernel-facts.md
KERNEL_61_PKG=linux-image-6.1.0-56-amd64
KERNEL_61_VERSION=6.1.192-2
KERNEL_61_SUITES="bookworm bookworm-updates"   # + bookworm-security from the security URI
KERNEL_61_KVER=6.1.0-56-amd64

# trixie-backports: rxe moves between netns in exclusive mode
KERNEL_73_KVER=7.3.4+deb13-amd64
KERNEL_73_PKGS="linux-binary-7.3.4+deb13-amd64 linux-modules-7.3.4+deb13-amd64"
KERNEL_73_SUITES="trixie-backports"
KERNEL_73_VERSION=7.3.4-1~bpo13+1

VNG_VERSION=1.42

# Cache outside the checkout and NOT under /var/cache or /var/lib/apt: virtme-ng-init
# hides those behind tmpfs inside the guest.
RDMAD_GUEST_CACHE=${RDMAD_GUEST_CACHE:-/opt/rdmad-guest}
