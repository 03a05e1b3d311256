"""The kubelet's .proto files rdmad-dra serves, and the *_pb2 modules generated from them
when the package is built (scripts/gen-proto.sh; not in git)."""
