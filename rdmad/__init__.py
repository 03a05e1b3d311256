"""rdmad: claim and release RDMA devices for network namespaces."""

__version__ = "0.1.0"
