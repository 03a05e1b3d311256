"""rdmad-dra: rdmad's Kubernetes DRA (Dynamic Resource Allocation) kubelet plugin.

A D-Bus client of rdmad, as rdmad-exporter is: rdmad stays free of Kubernetes. It
registers with the kubelet, and publishes the node's RDMA devices as resource.k8s.io/v1
ResourceSlices, kept current from rdmad's signals. It does not prepare claims yet
(docs/kubernetes.md says what is missing).
"""
