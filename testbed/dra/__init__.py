"""rdmad-dra's doubles: the kubelet's gRPC calls (kubelet.py, on wire.py's messages), a
loopback API server (apiserver.py), the plugin process (plugin_process.py), ResourceClaims
(claims.py), an in-process rdmad whose devices come and go (hotplug_rdmad.py), and the
DaemonSet's manifest as a run of the plugin reads it (daemonset.py)."""
