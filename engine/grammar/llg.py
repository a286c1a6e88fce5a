"""llguidance, the constraint engine of llama.cpp, vLLM and SGLang: the one module that imports
it. A grammar is compiled once per request for the target's vocabulary (`compile_grammar`) and
each generation walks a fresh matcher over its answer (`Grammar.start`, a `Constraint`).

The tokenizer llguidance needs is built from the backend's `TokenTable` (every token's bytes,
control tokens flagged with llguidance's 0xFF prefix, as its own llama.cpp reader does), about a
second for a 151,936-token vocabulary, so it is built once per loaded model and kept. A JSON
schema compiles to compact JSON (no optional whitespace): the model cannot spend tokens on
spaces and newlines, and a quarter of the tokens of a typical object are then forced.
"""
from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark

from engine.backend import Backend
from engine.errors import GrammarError
from engine.grammar.mask import TokenMask
from engine.grammar.spec import GBNF, JSON_OBJECT, JSON_SCHEMA, LARK, REGEX, GrammarSpec

# llguidance marks a control token by this first byte: no grammar literal can spell it.
_CONTROL = b"\xff"
# Compact JSON: keys, colons, commas and brackets are then often the one token allowed.
_JSON_OPTIONS: Any = {"whitespace_flexible": False}

_TOKENIZERS: "weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer]" = (
    weakref.WeakKeyDictionary())


class _Wrapper:
    """What llguidance's TokenizerWrapper reads: the token table and a tokenize function."""

    def __init__(self, backend: Backend) -> None:
        vocab = backend.token_table()
        self.eos_token_id = vocab.eos if vocab.eos >= 0 else None
        self.bos_token_id = None
        self.tokens = [_CONTROL + piece if t in vocab.control else piece
                       for t, piece in enumerate(vocab.pieces)]
        self.special_token_ids = sorted(vocab.control)
        self._tokenize = backend.tokenize

    def __call__(self, data: bytes) -> list[int]:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        return self._tokenize(text, add_special=False, parse_special=False)


def tokenizer_for(backend: Backend) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for `backend`'s vocabulary, built on first use and kept with it."""
    tok = _TOKENIZERS.get(backend)
    if tok is None:
        wrapper = llguidance.TokenizerWrapper(_Wrapper(backend))
        eos = backend.token_table().eos
        tok = llguidance.LLTokenizer(wrapper, n_vocab=backend.n_vocab,
                                     eos_token=eos if eos >= 0 else None)
        _TOKENIZERS[backend] = tok
    return tok


def _grammar_text(spec: GrammarSpec) -> str:
    """The grammar in a form llguidance reads: Lark text, or its JSON of named grammars (what
    its schema and regex converters write); with a lead, the lead's Lark first, then the
    grammar itself under the name the lead gives it, `answer`."""
    text = _body_text(spec)
    if not spec.lead:
        return text
    if text.lstrip().startswith("{"):
        grammars = json.loads(text)["grammars"]
        if len(grammars) != 1:
            raise GrammarError(f"the {spec.kind} grammar cannot follow a lead: it holds "
                               f"{len(grammars)} grammars")
        body = dict(grammars[0])
    else:
        body = {"lark_grammar": text}
    return json.dumps({"grammars": [{"name": "lead", "lark_grammar": spec.lead},
                                    {**body, "name": "answer"}]})


def _body_text(spec: GrammarSpec) -> str:
    if spec.kind == JSON_SCHEMA:
        return llguidance.LLMatcher.grammar_from_json_schema(json.loads(spec.source),
                                                              defaults=_JSON_OPTIONS)
    if spec.kind == JSON_OBJECT:
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                              defaults=_JSON_OPTIONS)
    if spec.kind == REGEX:
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    if spec.kind == GBNF:
        try:
            return gbnf_to_lark(spec.source)
        except Exception as exc:  # its parser raises its own error types
            raise GrammarError(f"the GBNF grammar is not valid: {_first_line([str(exc)])}") from None
    assert spec.kind == LARK
    return llguidance.LLMatcher.grammar_from_lark(spec.source)


def _first_line(messages: Sequence[str]) -> str:
    """llguidance's message in one line: a Lark error goes on with the grammar's line and a
    caret under the column, which its first line already names."""
    lines = [line.strip() for m in messages for line in m.splitlines() if line.strip()]
    return lines[0] if lines else "refused"


@dataclass(frozen=True)
class Grammar:
    """A grammar compiled for one vocabulary; `start` gives a generation its constraint."""

    spec: GrammarSpec
    text: str
    tokenizer: llguidance.LLTokenizer
    n_vocab: int

    def start(self) -> "LlgConstraint":
        return LlgConstraint(llguidance.LLMatcher(self.tokenizer, self.text, log_level=0),
                             self.n_vocab)


def compile_grammar(spec: GrammarSpec, backend: Backend) -> Grammar:
    """`spec` compiled for `backend`'s vocabulary; GrammarError with llguidance's message when
    it refuses the schema or grammar."""
    tok = tokenizer_for(backend)
    what = "JSON schema" if spec.kind in (JSON_SCHEMA, JSON_OBJECT) else f"{spec.kind} grammar"
    try:
        text = _grammar_text(spec)
    except GrammarError:
        raise
    except ValueError as exc:  # llguidance's converters refuse some input before validation
        raise GrammarError(f"the {what} is not valid: {_first_line([str(exc)])}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, tok)
    if is_error:
        raise GrammarError(f"the {what} is not valid: {_first_line(messages)}")
    return Grammar(spec, text, tok, backend.n_vocab)


class LlgConstraint:
    """One answer's walk through a compiled grammar (engine/grammar/guide.py's `Constraint`)."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int) -> None:
        self._m = matcher
        self.n_vocab = n_vocab
        self._check()

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarError(f"the grammar cannot continue: {_first_line([self._m.get_error()])}")

    def mask(self) -> TokenMask:
        words = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint32)
        self._check()
        return TokenMask(self.n_vocab, words)

    def consume(self, tokens: Sequence[int]) -> int:
        if not tokens:
            return 0
        took = self._m.try_consume_tokens([int(t) for t in tokens])
        self._check()
        return took

    def rollback(self, n: int) -> None:
        if n > 0:
            self._m.rollback(n)
            self._check()
