#!/bin/bash
# gen-proto.sh - generate rdmad-dra's protobuf modules from the kubelet's .proto files:
# rdmad/dra/rpc/proto/<name>.proto -> <name>_pb2.py beside it (not in git; rdmad/dra/rpc/api.py
# imports them). Run when the package is built: scripts/bootstrap.sh for the dev venv,
# debian/rules for the .deb (from a build venv of requirements/build.txt), so grpcio-tools,
# a compiler, is no run-time dependency of rdmad-dra.
#
#   scripts/gen-proto.sh [PYTHON]   PYTHON has grpcio-tools (default: the checkout's .venv)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${1:-$ROOT/.venv/bin/python}
PROTO=$ROOT/rdmad/dra/rpc/proto
"$PYTHON" -m grpc_tools.protoc --proto_path="$PROTO" --python_out="$PROTO" "$PROTO"/*.proto
