"""Constrained decoding: a grammar's mask is part of p and q (engine/grammar/mask.py), one
round walks the grammar over its drafted tokens (engine/grammar/guide.py), and llguidance is the
grammar engine (engine/grammar/llg.py, the one place that imports it)."""
