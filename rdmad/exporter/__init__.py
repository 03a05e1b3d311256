"""rdmad-exporter: rdmad's Prometheus exporter. A client: it speaks only the bus
(rdmad.bus.client) and the vocabulary."""
