"""containerd through CRI, as a Kubernetes node runs it (tests/cri)."""
