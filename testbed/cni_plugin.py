"""The CNI plugin that tests/cni, the guest's podman test and the benchmark run: the Go
binary that scripts/build-cni.sh builds from cni/ (`make setup` does), in the checkout."""

from __future__ import annotations

from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "build" / "cni" / "rdmad-cni"
