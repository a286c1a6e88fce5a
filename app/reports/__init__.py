"""Report writers for `tandem bench` and `tandem exactness`: Markdown and PNG plots. They only
format what `bench` returns (the raw runs, JSON and CSV, are bench/benchmark/files.py's)."""
