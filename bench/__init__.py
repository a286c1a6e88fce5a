"""Measurement, apart from the decoding core: benchmarks (`benchmark`), the engine's own time per
token (`overhead`), the exactness report (`exactness`), `tandem tune`'s measurements (`tuning`),
the predicted speculation ceiling (`ceiling`), the fake backends tests and benchmarks share
(`fakes`) and the research drivers kept for docs/ (`research`, run as `python -m bench.research.X`).

bench builds on loading, models and the engine, and imports nothing of app; app formats what it
returns (app/reports) and runs it (`tandem bench`, `exactness`, `tune`, `calibrate`). The engine
imports nothing from here (tests/test_layers.py)."""
