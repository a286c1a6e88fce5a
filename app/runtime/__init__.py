"""What the CLI, the app and the API share while Tandem runs: the names and defaults users see
(`defaults`), the one way to open a pair (`open_pair`), the hold on the loaded pair (`holder`)
and the one generation queue (`queue`).
Each surface reads them from here, so the three agree."""
