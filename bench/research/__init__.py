"""Research drivers kept for the docs: each regenerates a table of docs/ (scripts/benchmarks runs
most of them) and runs as `python -m bench.research.NAME ARGS` from the repository root.

- `bench_tables`, `history_table`, `control_pairs`: tables from `tandem bench` runs;
- `policy_sim`: the suite replayed without noise over a recorded trace (docs/design/controller.md);
- `cost_profile_table`: the default on the synthetic cost profiles (bench/fakes/costed.py);
- `batch_replay`: the controller's decisions by batch width on the GPU and CPU cost profiles;
- `measure_costs`: verify and draft costs by batch width, draft decode times, draft agreement;
- `row_drift`: whether a verify row's numerics depend on its batch width (docs/EXACTNESS.md);
- `soak`: many requests through one `tandem serve` (docs/RELIABILITY.md)."""
