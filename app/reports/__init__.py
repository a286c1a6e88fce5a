"""Report writers for `tandem bench` and `tandem exactness`: raw JSON, CSV, Markdown and PNG
plots. They only format what `engine.tools.benchmark` and `engine.tools.exactness` return."""
