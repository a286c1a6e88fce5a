"""Tooling built on the decoding core, apart from it: benchmarks (`benchmark`), the exactness
report (`exactness`), `tandem tune`'s measurements (`tuning`) and the predicted speculation
ceiling (`ceiling`). The core imports nothing from here (tests/test_layers.py)."""
