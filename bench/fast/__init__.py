"""Probes and benchmarks of the fast engine (core/engines/fast) on one CUDA GPU, run as `python -m bench.fast.NAME`;
they call its public names only. Results, with machine and date: docs/fast-engine.md and docs/perf-log/."""
