"""rdmad test suite."""
