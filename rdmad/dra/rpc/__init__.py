"""The gRPC plumbing of rdmad-dra: the kubelet's APIs loaded from their .proto files, and a
server on a Unix socket that exists only while the kubelet calls."""
