"""The gRPC plumbing of rdmad-dra: the kubelet's APIs loaded from their .proto files, and a
grpclib server on a Unix socket."""
