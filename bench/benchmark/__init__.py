"""Benchmarking speculative decoding against plain decoding of the same target: the prompt
suite, the runner that pairs every speculative run with a baseline run, and the aggregation
into speedup distributions, gamma sweeps, the Amdahl view and the Leviathan et al. prediction.
Everything here returns data; the reports in `app/reports` format it."""
