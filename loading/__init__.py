"""The loading step, above both the engine and the models library: it checks the files, the
pair's compatibility and the memory budget, derives the draft files a load asks for, loads the
backends and builds the engine's Pair from them. The app (CLI, UI, API, bench) loads through
`loading.load.load_pair` with a `loading.options.LoadOptions`.

Layers (tests/test_layers.py holds them): app -> bench -> loading -> {models, engine};
models -> engine.errors only; engine -> nothing of ours. Derived GGUFs (requantized, early-exit and vocabulary-trimmed
drafts) are made in `loading.derived`, by one path rule and one hasher (loading/derived/files.py).
"""
