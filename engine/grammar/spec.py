"""What a request constrains its answer to, as the user gave it: a JSON schema, any JSON
object, or a grammar in Lark, GBNF or a regular expression. A value the front ends build
(`--json-schema`, `--grammar`, the API's `response_format`, the page's structured-output box)
and the engine compiles for the target's vocabulary (engine/grammar/llg.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from engine.errors import GrammarError

JSON_SCHEMA, JSON_OBJECT, LARK, GBNF, REGEX = "json_schema", "json_object", "lark", "gbnf", "regex"
KINDS = (JSON_SCHEMA, JSON_OBJECT, LARK, GBNF, REGEX)


@dataclass(frozen=True)
class GrammarSpec:
    kind: str
    # The schema as JSON text, or the grammar's text; empty for JSON_OBJECT.
    source: str = ""
    # Lark rules (llguidance's dialect) of what the answer writes before the part this grammar
    # holds, which they name `@answer` (a reasoning model's thinking: app/runtime/reasoning.py);
    # empty: the grammar holds the answer from its first token.
    lead: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.kind == JSON_SCHEMA:
            try:
                schema = json.loads(self.source)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise GrammarError("a JSON schema must be an object (or true/false)")
        elif self.kind != JSON_OBJECT and not self.source.strip():
            raise GrammarError(f"the {self.kind} grammar is empty")

    @classmethod
    def schema(cls, schema: object) -> "GrammarSpec":
        """A JSON schema given as a parsed value (the API's body, a loaded file)."""
        return cls(JSON_SCHEMA, json.dumps(schema))

    @classmethod
    def from_file(cls, text: str, name: str) -> "GrammarSpec":
        """A grammar file by its name: .gbnf is GBNF, anything else Lark (which also takes
        llguidance's JSON and regex extensions); `tandem generate --grammar`."""
        return cls(GBNF if name.lower().endswith(".gbnf") else LARK, text)
