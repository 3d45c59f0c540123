"""Benchmarks: each module runs as `python -m bench.NAME` from the repository root, prints a table, and its results
are recorded with the machine and date in docs/perf-log/ (the latest of each in
docs/PERFORMANCE.md's table)."""
