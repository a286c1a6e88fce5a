"""Tool calls in each template's own syntax (app/runtime/tool_syntax.py): the grammar each
tool_choice gets, walked token by token over the byte-level fakes' vocabularies (the tags as
control tokens, and as plain text), and the model's text read back as calls, whole and as it
streams; which row a template is; the Hermes fallback for a template that does not read
`tools`."""
from __future__ import annotations

import json

import pytest

from app.runtime.tool_calls import (AUTO, NONE, REQUIRED, Function, ToolChoice, Tools,
                                    as_text_turns, prompt_with_tools, turns_as_text)
from app.runtime.tool_grammar import control_tokens, tool_grammar
from app.runtime.tool_reading import Arguments, Call, CallReader, Content, ends_calls, read_answer
from app.runtime.tool_syntax import BY_NAME, CODER, HERMES, LLAMA3, MISTRAL, QWEN3_XML, as_read, detect
from engine.grammar.llg import compile_grammar
from tests.byte_fake import EOG, ByteFake, ChatByteFake
from bench.fakes.backend import FakeBackend

WEATHER = Function("get_weather", {"type": "object", "additionalProperties": False,
                                   "required": ["city"],
                                   "properties": {"city": {"type": "string"}}}, "the weather")
TIME = Function("get_time", {"type": "object", "properties": {}})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
# How Qwen2.5-Coder-1.5B answers "What is the weather in Paris right now?" (measured).
FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
TOOLS_TAG = '<tools>\n{"name": "get_time", "arguments": {}}\n</tools>'
LLAMA = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL_CALLS = ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, '
                 '{"name": "get_weather", "arguments": {"city": "Rome"}}]')
XML = ('<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
       '</function>\n</tool_call>')


def accepts(tools: Tools, text: str, syntax: str = HERMES, backend=None) -> bool:
    """Whether the grammar lets the byte model write `text` and then end."""
    backend = backend or ChatByteFake()
    row = BY_NAME[syntax]
    spec = tool_grammar(row, tools, control_tokens(backend, row))
    assert spec is not None
    walk = compile_grammar(spec, backend).start()
    tokens = backend.tokenize(text, add_special=False, parse_special=True)
    return walk.consume(tokens) == len(tokens) and walk.mask().allows(EOG)


def choice(mode: str = AUTO, name: str | None = None, parallel: bool = True,
           weather: Function = WEATHER) -> Tools:
    return Tools((weather, TIME), ToolChoice(mode, name), parallel)


@pytest.mark.parametrize("tools, text, ok", [
    (choice(), "It is sunny.", True),
    (choice(), CALL, True),
    (choice(), CALL + "\n" + CALL_TIME, True),
    (choice(), FENCED, True),
    (choice(), TOOLS_TAG, True),
    # Lazy: text, then a call from the trigger on, and nothing after it.
    (choice(), "Let me look.\n" + FENCED, True),
    (choice(), "Let me look.\n" + FENCED + "\nDone.", False),
    # JSON that is not a call stays text (naming no tool offered, it is not a trigger); a
    # call's trigger, a tool's name included, holds the rest to that tool.
    (choice(), 'Here:\n```json\n{"city": "Paris"}\n```', True),
    (choice(), '```json\n{"name": "send_mail", "arguments": {}}\n```', True),
    (choice(), '```json\n{"name": "get_weather", "arguments": {"town": 1}}\n```', False),
    (choice(), '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',
     False),
    (choice(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>', False),
    (choice(REQUIRED), "It is sunny.", False),
    (choice(REQUIRED), CALL_TIME, True),
    (choice(REQUIRED, parallel=False), CALL + "\n" + CALL_TIME, False),
    (choice(REQUIRED, "get_time"), CALL_TIME, True),
    (choice(REQUIRED, "get_time"), CALL, False),
    (choice(REQUIRED, "get_time", parallel=False), CALL_TIME + "\n" + CALL_TIME, False),
    # strict: false guides: the syntax is held, the arguments are any object.
    (choice(weather=Function("get_weather", WEATHER.parameters, strict=False)),
     '<tool_call>\n{"name": "get_weather", "arguments": {"town": 1}}\n</tool_call>', True),
])
def test_the_grammar_of_each_tool_choice(tools, text, ok):
    assert accepts(tools, text) is ok


@pytest.mark.parametrize("syntax, text", [
    (HERMES, CALL), (HERMES, FENCED), (LLAMA3, LLAMA), (MISTRAL, MISTRAL_CALLS),
    (QWEN3_XML, XML)])
@pytest.mark.parametrize("backend", [ChatByteFake, ByteFake], ids=["tag-tokens", "plain-text"])
def test_each_rows_syntax_is_held_and_read(syntax, text, backend):
    row = BY_NAME[syntax]
    assert accepts(choice(), text, syntax, backend()) and accepts(choice(REQUIRED), text, syntax,
                                                                  backend())
    assert accepts(choice(), "Plain words.", syntax, backend())
    content, calls = read_answer(text, row, choice())
    assert content is None and calls and calls[-1].name == "get_weather"
    assert json.loads(calls[-1].arguments)["city"] in ("Paris", "Rome")


def test_a_control_token_written_as_nothing_is_not_looked_for_in_the_text():
    # Mistral's [TOOL_CALLS] is a control token: the grammar holds it, the text lacks it.
    shown = as_read(BY_NAME[MISTRAL], {"[TOOL_CALLS]"})
    content, calls = read_answer(MISTRAL_CALLS.removeprefix("[TOOL_CALLS]"), shown, choice())
    assert content is None and [c.name for c in calls] == ["get_time", "get_weather"]


def test_a_template_is_matched_to_its_row_by_what_it_renders():
    assert detect("...<tools>...</tools>...<tool_call>...").name == HERMES
    assert detect("[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]").name == MISTRAL
    assert detect('{"name": function name, "parameters": dictionary of argument name and its '
                  'value}').name == LLAMA3
    assert detect("<tool_call>\n<function=example>\n<parameter=x>").name == QWEN3_XML
    assert detect("anything else").name == HERMES
    assert detect('<tool_call>\n{{"name": <function-name>, "arguments": ...}}').name == CODER


def test_tool_choice_none_has_no_grammar_and_shows_no_tools():
    tools = choice(NONE)
    assert tool_grammar(BY_NAME[HERMES], tools, {}) is None
    messages = [{"role": "user", "content": "hi"}]
    shown = prompt_with_tools(ChatByteFake(), messages, tools)
    assert (shown.messages, shown.entries) == (tuple(messages), ())


def test_the_tags_are_the_vocabularys_own_tokens_where_it_has_them():
    row = BY_NAME[HERMES]
    assert control_tokens(ChatByteFake(), row) == {"<tool_call>": EOG + 1, "</tool_call>": EOG + 2}
    assert control_tokens(ByteFake(), row) == {}
    spec = tool_grammar(row, choice(), control_tokens(ChatByteFake(), row))
    assert spec is not None and f"<[{EOG + 1}]>" in spec.source


def test_a_template_that_reads_tools_gets_them_and_one_that_does_not_gets_the_hermes_text():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    native = prompt_with_tools(ChatByteFake(), messages, choice())
    assert native.messages == tuple(messages) and [e["function"]["name"] for e in native.entries] \
        == ["get_weather", "get_time"]
    fallback = prompt_with_tools(FakeBackend(), messages, choice())
    assert fallback.entries == () and fallback.syntax.name == HERMES
    assert fallback.messages == tuple(as_text_turns(messages, choice().functions))
    assert fallback.messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert fallback.messages[2] == {"role": "assistant", "content": CALL}
    assert fallback.messages[3] == {"role": "user",
                                    "content": "<tool_response>\nsunny\n</tool_response>"}


class CoderFake(ChatByteFake):
    """A template that writes Qwen2.5-Coder's example call, doubled braces and all."""

    def chat_prompt(self, messages, tools=None):
        example = ('<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
                   '</tool_call>\n' if tools else "")
        return example + super().chat_prompt(messages, tools)


def test_qwen25_coder_is_not_shown_its_tools_on_the_turn_after_their_results():
    called = [{"role": "user", "content": "weather?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
              {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    after = prompt_with_tools(CoderFake(), called, choice())
    assert after.syntax.name == CODER and after.entries == ()
    assert after.messages == tuple(turns_as_text(called))
    assert after.messages[1:] == ({"role": "assistant", "content": CALL}, {
        "role": "user", "content": "<tool_response>\nsunny\n</tool_response>"})
    # The first turn, and a new question after the results, are shown the tools ...
    for messages in (called[:1], [*called, {"role": "user", "content": "and Rome?"}]):
        shown = prompt_with_tools(CoderFake(), messages, choice())
        assert shown.syntax.name == CODER and len(shown.entries) == 2
    # ... and Qwen2.5's row (no doubled braces) is shown them after the results too.
    assert len(prompt_with_tools(ChatByteFake(), called, choice()).entries) == 2


def read(text: str, tools: Tools | None = None):
    return read_answer(text, BY_NAME[HERMES], tools or choice())


def test_an_answer_is_read_as_text_or_calls():
    assert read("It is sunny.") == ("It is sunny.", [])
    content, calls = read(CALL + "\n" + CALL_TIME)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    content, calls = read("Let me look.\n" + FENCED)
    assert content == "Let me look." and [c.name for c in calls] == ["get_weather"]
    # Cut off by max_tokens: the complete call, and the rest as it was written.
    content, calls = read(CALL + '\n<tool_call>\n{"name": "get_ti')
    assert len(calls) == 1 and content == '\n<tool_call>\n{"name": "get_ti'


@pytest.mark.parametrize("text", [
    'The JSON is {"name": "get_weather", "arguments": {"city": "Paris"}} as you see.',
    '```json\n{"name": "Bob", "arguments": {}}\n```',
    '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> and more',
])
def test_text_that_is_not_wholly_calls_to_offered_tools_with_valid_arguments_stays_text(text):
    content, calls = read(text)
    if calls:  # the last: a valid call, then text
        assert content == " and more"
    else:
        assert content == text


def test_a_repeated_call_ends_the_calls_and_one_call_unless_parallel():
    content, calls = read(CALL + "\n" + CALL_TIME + "\n" + CALL + "\n" + CALL_TIME)
    assert content is None and [c.name for c in calls] == ["get_weather", "get_time"]
    content, calls = read(CALL + "\n" + CALL_TIME, choice(parallel=False))
    assert content is None and [c.name for c in calls] == ["get_weather"]
    # The rule that stops the generation there, fed the answer as it is committed.
    until = ends_calls(BY_NAME[HERMES], choice())()
    text = CALL + "\n" + CALL_TIME + "\n" + CALL
    ends = [until(text[i:i + 5]) for i in range(0, len(text), 5)]
    assert ends[-1] and not any(ends[:-1])


def stream(text: str, tools: Tools, step: int = 3, strict: bool = True) -> list:
    reader = CallReader(BY_NAME[HERMES], tools, stream_arguments=strict)
    pieces = [p for i in range(0, len(text), step) for p in reader.push(text[i:i + step])]
    return pieces + reader.finish()


def test_a_streamed_call_sends_its_name_then_its_arguments_as_they_are_drawn():
    pieces = stream(CALL + "\n" + CALL_TIME, choice())
    assert [type(p) for p in pieces[:2]] == [Call, Arguments] and len(pieces) > 4
    args = "".join(p.text for p in pieces if isinstance(p, Arguments) and p.index == 0)
    assert json.loads(args) == {"city": "Paris"}
    assert [p.name for p in pieces if isinstance(p, Call)] == ["get_weather", "get_time"]
    # Not held to the schema (strict: false): the arguments come once complete and valid.
    whole = stream(CALL, choice(), strict=False)
    assert [type(p) for p in whole] == [Call, Arguments]
    # A repeat is held while it could still be the earlier call, then dropped.
    repeated = stream(CALL + "\n" + CALL, choice())
    assert [p.name for p in repeated if isinstance(p, Call)] == ["get_weather"]


def test_text_that_cannot_be_a_trigger_goes_out_at_once():
    reader = CallReader(BY_NAME[HERMES], choice())
    assert reader.push(" <tool") == [] and reader.push("s are") == [Content(" <tools are")]
    assert reader.push(" fun") == [Content(" fun")] and reader.finish() == []


# Every form each row reads, as the model writes it: (row, form, text). Qwen2.5-Coder's
# template shows its call with the braces doubled (`{{"name": <function-name>, ...}}`), and the
# model writes it so, in or out of the tags or a fence; the issue's answer is the bare doubled
# one (`{{"name": "weather", "arguments": {"city": "Paris"}}}`).
ARGS = '"arguments": {"city": "Paris"}'
FORMS = [
    (CODER, "tool_call", CALL),
    (CODER, "tool_call_doubled", '<tool_call>\n{{"name": "get_weather", ' + ARGS + '}}\n</tool_call>'),
    (CODER, "tools", '<tools>\n{"name": "get_weather", ' + ARGS + '}\n</tools>'),
    (CODER, "tools_doubled", '<tools>{{"name": "get_weather", ' + ARGS + '}}</tools>'),
    (CODER, "fence", FENCED),
    (CODER, "fence_doubled", '```json\n{{"name": "get_weather", ' + ARGS + '}}\n```'),
    (CODER, "bare", '{"name": "get_weather", ' + ARGS + '}'),
    (CODER, "bare_doubled", '{{"name": "get_weather", ' + ARGS + '}}'),
    (HERMES, "bare", '\n{"name": "get_weather", ' + ARGS + '}\n'),
    (LLAMA3, "llama3", LLAMA),
]


@pytest.mark.parametrize("row, form, text", FORMS, ids=[f"{r}-{f}" for r, f, _ in FORMS])
@pytest.mark.parametrize("backend", [ChatByteFake, ByteFake], ids=["tag-tokens", "plain-text"])
def test_every_form_a_template_shows_is_read_as_a_call_and_its_trigger_holds_it(row, form, text,
                                                                                 backend):
    assert form in {f.name for f in BY_NAME[row].forms}
    content, calls = read_answer(text, BY_NAME[row], choice())
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris"})]
    # As it streams, held while it could still be a call, then sent as one.
    reader = CallReader(BY_NAME[row], choice(), stream_arguments=True)
    pieces = [p for i in range(0, len(text), 2) for p in reader.push(text[i:i + 2])]
    pieces += reader.finish()
    assert [p.name for p in pieces if isinstance(p, Call)] == ["get_weather"]
    assert not any(isinstance(p, Content) and p.text.strip() for p in pieces)
    # The grammar allows it under `auto` and `required`; under `auto` the trigger holds the
    # rest to the call: a wrong argument, or text after the call, is refused.
    assert accepts(choice(), text, row, backend()) and accepts(choice(REQUIRED), text, row,
                                                               backend())
    assert not accepts(choice(), text.replace('"city"', '"town"'), row, backend())
    assert not accepts(choice(), text + " Done.", row, backend())


def test_the_issues_answer_on_the_coder_template_is_a_call():
    weather = Function("weather", {"type": "object", "required": ["city"],
                                   "properties": {"city": {"type": "string"}}})
    tools = Tools((weather,), ToolChoice(AUTO))
    shown = prompt_with_tools(CoderFake(), [{"role": "user", "content": "Paris?"}], tools)
    assert shown.syntax.name == CODER
    answer = '{{"name": "weather", "arguments": {"city": "Paris"}}}'
    content, calls = read_answer(answer, shown.syntax, tools)
    assert content is None and [(c.name, c.arguments) for c in calls] == \
        [("weather", '{"city": "Paris"}')]
    row = shown.syntax
    spec = tool_grammar(row, tools, control_tokens(ChatByteFake(), row))
    assert spec is not None
    walk = compile_grammar(spec, ChatByteFake()).start()
    # Once `{{"name": "weather"` is written, only the call may follow.
    assert walk.consume(list(b'{{"name": "weather"')) == len('{{"name": "weather"')
    assert not walk.mask().allows(EOG) and not walk.mask().allows(ord("x"))


@pytest.mark.parametrize("row", [CODER, HERMES, LLAMA3])
@pytest.mark.parametrize("text", [
    # A bare object is a call only at the answer's start ...
    'You would call it as {"name": "get_weather", "arguments": {"city": "Paris"}} here.',
    'Like so: {{"name": "get_weather", "arguments": {"city": "Paris"}}}',
    # ... and only when it names a tool offered.
    '{"name": "Alice", "age": 31}',
    '{{"name": "Bob"}}',
    '{"name": "get_weather_soon", "arguments": {}}',
    'The JSON {"city": "Paris"} is valid.',
])
def test_a_text_answer_that_mentions_json_stays_text(row, text):
    assert read_answer(text, BY_NAME[row], choice()) == (text, [])
    for backend in (ChatByteFake(), ByteFake()):
        assert accepts(choice(), text, row, backend)
    reader = CallReader(BY_NAME[row], choice())
    streamed = [p for i in range(0, len(text), 4) for p in reader.push(text[i:i + 4])]
    assert "".join(p.text for p in streamed + reader.finish()) == text
