"""The daemon: its composition root (rdmad.daemon.main), which wires the core to the kernel
adapters and the bus, and the host adapters only it uses (configuration, systemd, journald,
CDI specs)."""
