"""containerd through CRI, as a Kubernetes node runs it: the tests (tests/cri) and the
benchmark (bench/podstart.py) drive it as the kubelet does."""
