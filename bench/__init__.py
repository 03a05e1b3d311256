"""rdmad benchmarks: `python -m bench.run` (full, writes bench/results.md and PNGs) or
`python -m bench.run --smoke` (seconds; checks only that every scenario produces numbers)."""
