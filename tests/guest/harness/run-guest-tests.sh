#!/bin/bash
# run-guest-tests.sh - run tests/guest under pytest inside the RDMA guest, one boot per kernel.
#
#   tests/guest/harness/run-guest-tests.sh --kernel 7.3|6.1|all [--junit DIR] [--verbose]
#                                          [--timeout S] [pytest args...]
#
# --kernel all boots 7.3 then 6.1 and fails if either fails. --junit DIR (host dir, made
# writable in the guest) receives guest-<kernel>.xml. Everything else goes to pytest, e.g.
#   run-guest-tests.sh --kernel 7.3 -k netns -x
#   run-guest-tests.sh --kernel 6.1 tests/guest/test_rdma_kernel.py   (only that file)
# The tree is read-only in the guest: no pytest cache (-p no:cacheprovider), no .pyc writes.
# Exit status: pytest's (5 = nothing collected counts as failure too), 125 = guest did not
# boot / set-up failed, 124 = timeout. Never 0 unless pytest itself passed in the guest.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)

kernels=(); guest_opts=(); junit=""; pytest_args=()
while [ $# -gt 0 ]; do
    case $1 in
        --kernel) case ${2:?} in all) kernels=(7.3 6.1) ;; *) kernels+=("$2") ;; esac; shift 2 ;;
        --kernel=*) case ${1#*=} in all) kernels=(7.3 6.1) ;; *) kernels+=("${1#*=}") ;; esac; shift ;;
        --junit) junit=$(realpath -m "${2:?}"); shift 2 ;;
        --timeout) guest_opts+=(--timeout "${2:?}"); shift 2 ;;
        --verbose) guest_opts+=(--verbose); shift ;;
        --) shift; pytest_args+=("$@"); break ;;
        *) pytest_args+=("$1"); shift ;;
    esac
done
[ ${#kernels[@]} -gt 0 ] || { echo "[guest-tests] ERROR: --kernel 7.3|6.1|all is required" >&2; exit 2; }
[ -x "$ROOT/.venv/bin/python" ] || { echo "[guest-tests] ERROR: no $ROOT/.venv: run scripts/bootstrap.sh" >&2; exit 2; }

if [ -n "$junit" ]; then mkdir -p "$junit"; guest_opts+=(--rwdir "$junit"); fi

# Explicit test paths among the pytest args replace the default selection.
paths=(tests/guest)
for a in "${pytest_args[@]}"; do
    case $a in tests/guest*) paths=(); break ;; esac
done

cd "$ROOT"
failed=()
for k in "${kernels[@]}"; do
    # smoke_first: the environment smoke test runs before anything can leave state behind.
    # No guest test uses hypothesis: its pytest plugin alone imports it, seconds under TCG.
    args=(-p no:cacheprovider -p no:hypothesispytest -p tests.guest.harness.smoke_first
          -ra "${pytest_args[@]}")
    [ -n "$junit" ] && args+=("--junitxml=$junit/guest-$k.xml")
    echo "[guest-tests] kernel $k: pytest ${paths[*]} ${pytest_args[*]}" >&2
    set +e
    "$HERE/run-in-guest.sh" --kernel "$k" "${guest_opts[@]}" -- \
        env PYTHONDONTWRITEBYTECODE=1 .venv/bin/python -m pytest "${paths[@]}" "${args[@]}"
    rc=$?
    set -e
    if [ "$rc" != 0 ]; then
        echo "[guest-tests] FAILED: kernel $k, exit status $rc" >&2
        failed+=("$k:$rc")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "[guest-tests] FAILED kernels: ${failed[*]}" >&2
    # keep a single-kernel run's own status (124/125/pytest's); several -> 1
    if [ ${#kernels[@]} = 1 ]; then exit "${failed[0]#*:}"; fi
    exit 1
fi
echo "[guest-tests] passed on kernel(s) ${kernels[*]}" >&2
