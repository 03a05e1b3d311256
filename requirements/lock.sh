#!/bin/bash
# lock.sh - re-resolve the dependency locks (`make lock`): every package at its newest
# version that pyproject.toml allows, each with the hashes of all its files on the index.
#
#   runtime.txt  pyproject's dependencies, the exporter extra (+ runtime.in) and the build
#                backend: the rdmad package's venv (debian/rules) installs exactly this
#   dra.txt      the same + the dra extra, at runtime.txt's versions (dra.in): the
#                rdmad-dra package's venv
#   build.txt    grpcio-tools at dra.txt's versions (build.in): debian/rules generates
#                rdmad-dra's *_pb2 modules with it (scripts/gen-proto.sh); not shipped
#   dev.txt      the same + the dev, bench and dra extras: scripts/bootstrap.sh's .venv
#
# Run from a bootstrapped checkout (pip-compile comes from the dev extra). The locks are
# resolved against pip's default public index only: a machine's own pip configuration
# (extra indexes, wheel directories, constraints) must not leak into a committed lock.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
compile=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT
         PIP_CONFIG_FILE=/dev/null CUSTOM_COMPILE_COMMAND="make lock"
         "$ROOT/.venv/bin/pip-compile" --quiet --upgrade --generate-hashes --allow-unsafe
         --strip-extras --no-emit-find-links --no-emit-index-url)
"${compile[@]}" --extra exporter -o requirements/runtime.txt pyproject.toml requirements/runtime.in
"${compile[@]}" --extra dra -o requirements/dra.txt pyproject.toml requirements/dra.in
"${compile[@]}" -o requirements/build.txt requirements/build.in
"${compile[@]}" --extra exporter --extra dev --extra bench --extra dra -o requirements/dev.txt \
    pyproject.toml requirements/dev.in
