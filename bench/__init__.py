"""rdmad benchmarks: `python -m bench.run` (full, writes bench/out/) or `python -m bench.run
--smoke` (under a minute; checks only that every scenario produces numbers)."""
