"""What the tests and the benchmark both run rdmad with: the daemon's process and a plain
D-Bus client (daemon.py, with its fault-injecting entry point faulty_rdmad.py), a private
dbus-daemon (bus.py), network namespaces and the `ip` helpers (net.py), child processes
(children.py), the CNI plugin's path (cni_plugin.py), a process's threads (threads.py), and
rdmad-dra's doubles of the kubelet and the API server (dra/). Not part of the rdmad package."""
