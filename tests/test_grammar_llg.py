"""llguidance as the constraint engine (engine/grammar/llg.py): schemas and grammars compile for
a backend's own vocabulary, bad ones are refused with llguidance's message, its masks drive the
round, and exact enumeration with its real matcher gives plain constrained sampling's law.

The fake here spells JSON: eight tokens whose bytes make `{"a":1}`, with a tokenize function
consistent with them (llguidance tokenizes what the grammar forces, and allows only the
canonical spelling of it)."""
from __future__ import annotations

import json
from typing import Sequence

import pytest

from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.errors import GrammarError
from engine.events import FORCED, DoneEvent, TokenEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.grammar.llg import compile_grammar
from engine.grammar.spec import GrammarSpec
from engine.pair import Pair
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.table import VirtualClock
from tests.exact_law import exact_law, total_variation
from tests.grammar_fakes import SpelledTable, constrained_law

PIECES = [b"{", b"}", b'"a"', b":", b"1", b'"', b"a", b""]
END = 7
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


class JsonFake(SpelledTable):
    """TableFake's rows, with a vocabulary that spells `{"a":1}` and an end token."""
    PIECES = tuple(PIECES)
    END = END


def schema_grammar(backend):
    return compile_grammar(GrammarSpec.schema(SCHEMA), backend)


def test_the_schema_forces_its_structure_and_ends_the_answer():
    backend = JsonFake(seed=2, eog=END)
    c = schema_grammar(backend).start()
    # `{` then the key `"a"` and `:` are the only tokens the grammar allows, one after another.
    forced = []
    while (m := c.mask()).single is not None and m.single != END:
        forced.append(m.single)
        c.consume([m.single])
    # ... and the digit: "1" is the only one this vocabulary has.
    assert b"".join(PIECES[t] for t in forced) == b'{"a":1'
    assert sorted(c.mask().ids().tolist()) == [1, 4]  # "}" or another digit
    assert c.consume([1]) == 1
    assert c.mask().single == END


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.0)], ids=["T=1", "greedy"])
@pytest.mark.parametrize("kind", ["draft-model", "lookup"])
def test_enumeration_with_llguidance_gives_the_constrained_law(kind, sampling):
    prompt = JsonFake(eog=END).tokenize('{"a":11}{"a":1')
    n = 7
    forced_seen = [0]

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(JsonFake(seed=2, eog=END, clock=clock))
        drafter = (DraftModelDrafter(JsonFake(seed=2, noise=0.8, eog=END, clock=clock))
                   if kind == "draft-model" else
                   PromptLookupDrafter(ngram_max=2, is_eog=lambda t: t == END))
        config = GenerationConfig(params=sampling, gamma=2, max_tokens=n,
                                  grammar=schema_grammar(target.backend))
        events = list(generate(target, drafter, prompt, config, rng=rng, clock=clock.now))
        forced_seen[0] += sum(isinstance(e, TokenEvent) and e.origin == FORCED for e in events)
        done = events[-1]
        assert isinstance(done, DoneEvent)
        return done.tokens

    spec = exact_law(run)
    fake = JsonFake(seed=2, eog=END)
    want = constrained_law(fake._row, prompt, sampling, n,
                           start=schema_grammar(fake).start, end=END)
    assert total_variation(spec, want) < 1e-9
    assert forced_seen[0] > 0
    # Every answer is the schema's: {"a":1...}, closed when it ended.
    for tokens in spec:
        text = b"".join(PIECES[t] for t in tokens)
        assert text.startswith(b'{"a":1')


def test_a_speculative_answer_parses_and_carries_log_probabilities():
    target, draft = JsonFake(seed=2, eog=END), JsonFake(seed=2, noise=0.5, eog=END)
    pair = Pair(target, draft)
    config = GenerationConfig(params=SamplingParams(temperature=1.0, seed=5), gamma=3,
                              max_tokens=40, grammar=pair.compile_grammar(GrammarSpec.schema(SCHEMA)),
                              logprobs=2)
    events = list(pair.generate_tokens(target.tokenize('{"a":1}'), config, drafter="draft"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    if done.stats.finish_reason == "eos":
        assert json.loads(done.text) == {"a": int(done.text[5:-1])}
    tokens = [e for e in events if isinstance(e, TokenEvent) and e.token >= 0]
    assert all(e.logprob is not None and e.logprob.token == e.token and e.logprob.logprob <= 0
               and len(e.logprob.top) == 2 for e in tokens)
    assert done.stats.forced_tokens > 0


@pytest.mark.parametrize("spec, message", [
    (GrammarSpec.schema({"type": "object", "properties": {"a": {"type": "strin"}}}),
     "the JSON schema is not valid: .*strin"),
    (GrammarSpec("lark", "start: foo"), "the lark grammar is not valid: .*foo"),
    (GrammarSpec("gbnf", "root ::= (\"a\""), "the GBNF grammar is not valid"),
], ids=["schema", "lark", "gbnf"])
def test_a_bad_grammar_is_refused_with_llguidances_message(spec, message):
    with pytest.raises(GrammarError, match=message) as err:
        compile_grammar(spec, JsonFake(eog=END))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind, source", [("json_schema", "{"), ("json_schema", "[1]"),
                                          ("lark", "  "), ("xml", "x")])
def test_a_malformed_spec_is_one_line(kind, source):
    with pytest.raises(GrammarError) as err:
        GrammarSpec(kind, source)
    assert "\n" not in str(err.value)


def test_a_grammar_file_is_read_by_its_name():
    assert GrammarSpec.from_file('root ::= "a"', "x.gbnf").kind == "gbnf"
    assert GrammarSpec.from_file('start: "a"', "x.lark").kind == "lark"


def test_a_regex_and_a_gbnf_grammar_constrain_too():
    backend = JsonFake(eog=END)
    for spec in (GrammarSpec("regex", "1+"), GrammarSpec("gbnf", 'root ::= "1"+')):
        c = compile_grammar(spec, backend).start()
        assert c.mask().ids().tolist() == [4]
        c.consume([4])
        assert sorted(c.mask().ids().tolist()) == [4, END]


def _tokens(text: str) -> Sequence[int]:
    return JsonFake(eog=END).tokenize(text)


@pytest.mark.parametrize("gamma, logprobs", [(8, None), (2, 2), (8, 3)])
def test_a_draft_that_draws_the_end_inside_a_round_settles(gamma, logprobs):
    """A draft longer than what the grammar leaves draws the end token inside its round (and,
    with log probabilities asked for, a round whose grammar allows only the end still drafts):
    llguidance's try-consume refuses an end token, so the guide never consumes one, and every
    answer is the schema's."""
    from tests.byte_fake import ByteFake
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for seed in range(6):
        target, draft = ByteFake(seed=seed), ByteFake(seed=seed, noise=0.3)
        pair = Pair(target, draft)
        config = GenerationConfig(params=SamplingParams(temperature=1.0, seed=seed), gamma=gamma,
                                  max_tokens=64, logprobs=logprobs,
                                  grammar=pair.compile_grammar(GrammarSpec.schema(schema)))
        policy = pair.make_policy("fixed", "draft", gamma)
        done = list(pair.generate_tokens(target.tokenize("x"), config, drafter="draft",
                                         policy=policy))[-1]
        assert done.stats.finish_reason == "eos"
        assert json.loads(done.text) in ({"ok": True}, {"ok": False})


def test_a_vocabulary_that_cannot_follow_the_grammar_is_a_one_line_error():
    """bench/fakes/backend.py's fake spells only letters and tokenizes inconsistently with its pieces:
    llguidance's mask then allows a token its matcher refuses. The answer stops with a
    GrammarError (a 400-class error the front ends show as one line), never an assertion."""
    from bench.fakes.backend import FakeBackend
    target = FakeBackend(n_vocab=64, eog=0)
    pair = Pair(target, FakeBackend(n_vocab=64, eog=0, noise=0.5))
    config = GenerationConfig(params=SamplingParams(temperature=1.0, seed=1), gamma=3,
                              max_tokens=16,
                              grammar=pair.compile_grammar(GrammarSpec("json_object")))
    with pytest.raises(GrammarError) as err:
        list(pair.generate_tokens(target.tokenize("x"), config, drafter="draft"))
    assert "\n" not in str(err.value)
