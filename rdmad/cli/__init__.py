"""rdmactl: rdmad's command line. A client: it speaks only the bus (rdmad.bus.client) and
the vocabulary."""
