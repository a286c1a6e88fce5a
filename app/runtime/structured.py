"""Structured output as the front ends read it: a JSON schema the user typed or saved in a file
(`tandem generate --json-schema`, the page's structured-output box), a grammar file
(`--grammar`), or the page's "JSON object" choice, turned into the `GrammarSpec` that
`resolve` hands the engine (app/runtime/request.py). A schema's text is read as the API reads
its body, parsed then written back compactly, so the same schema is the same spec (and the
same compiled grammar in the pair's cache) whichever front end sent it.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.errors import SettingsError
from engine.grammar.spec import JSON_OBJECT, JSON_SCHEMA, GrammarSpec

# The page's structured-output choices (app/ui/controls.py).
OFF, SCHEMA, OBJECT = "off", "JSON schema", "JSON object"
OUTPUT_CHOICES = (OFF, SCHEMA, OBJECT)


def schema_spec(text: str) -> GrammarSpec:
    """The spec of a JSON schema given as text; GrammarError when it is not JSON or not a
    schema's shape (llguidance judges the rest when the pair compiles it)."""
    checked = GrammarSpec(JSON_SCHEMA, text)
    return GrammarSpec.schema(json.loads(checked.source))


def output_spec(choice: str | None, schema: str | None) -> GrammarSpec | None:
    """The page's structured-output setting: off (None), any JSON object, or the schema typed
    in the box (which must then hold one)."""
    choice = choice or OFF
    if choice not in OUTPUT_CHOICES:
        raise SettingsError(f"structured output must be one of {', '.join(OUTPUT_CHOICES)}, "
                            f"got {choice!r}")
    if choice == OBJECT:
        return GrammarSpec(JSON_OBJECT)
    if choice == SCHEMA:
        if not (schema or "").strip():
            raise SettingsError("structured output: paste a JSON schema in the box, or choose "
                                f"{OFF!r} or {OBJECT!r}")
        return schema_spec(schema or "")
    return None


def read_file(path: str, option: str) -> str:
    """A schema or grammar file's text; SettingsError in one line when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{option}: file not found: {path}") from None
    except IsADirectoryError:
        raise SettingsError(f"{option}: {path} is a folder, not a file") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{option}: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise SettingsError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None


def file_spec(json_schema: str | None, grammar: str | None) -> GrammarSpec | None:
    """The command line's constraint: a JSON schema file, or a grammar file (.gbnf is GBNF,
    anything else Lark), or neither (argparse keeps the two options apart)."""
    if json_schema is not None:
        return schema_spec(read_file(json_schema, "--json-schema"))
    if grammar is not None:
        return GrammarSpec.from_file(read_file(grammar, "--grammar"), grammar)
    return None
