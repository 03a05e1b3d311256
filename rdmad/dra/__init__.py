"""rdmad-dra: rdmad's Kubernetes DRA (Dynamic Resource Allocation) kubelet plugin.

A D-Bus client of rdmad, as rdmad-exporter is: rdmad stays free of Kubernetes. It
registers with the kubelet, and publishes the node's RDMA devices as resource.k8s.io/v1
ResourceSlices, kept current from rdmad's signals. It prepares a claim by holding its
devices in rdmad for the claim's pod (Manager.Hold); rdmad-cni attaches them to the pod's
netns when its sandbox is made (Manager.Attach). docs/kubernetes.md.
"""
