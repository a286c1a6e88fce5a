"""The fake backends tests and benchmarks share, one file a fake: a seeded-hash model and a
scripted drafter (`backend`), a table lookup on a virtual clock (`table`), fakes whose draft agrees
at a scripted rate and whose decodes cost a machine's profile (`costed`), backends that answer at
once from banks of rows (`instant`) and ones that spell text with a real vocabulary (`spelled`).
No model is loaded; what is test-only (fixtures, the exact-law enumeration) stays in tests/."""
