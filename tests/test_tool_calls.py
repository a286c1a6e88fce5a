"""The tool-call syntax (app/runtime/tool_calls.py): the grammar each tool_choice gets, walked
token by token over the byte-level fake's vocabulary, and the model's text read back as calls,
whole and as it streams; the Hermes fallback for a template that does not read `tools`."""
from __future__ import annotations

import json

import pytest

from app.runtime.tool_calls import (AUTO, NONE, REQUIRED, Call, CallReader, Content, Function,
                                    ToolChoice, Tools, as_text_turns, prompt_with_tools,
                                    read_answer, tags_are_tokens, tool_grammar)
from engine.grammar.llg import compile_grammar
from tests.byte_fake import EOG, ChatByteFake
from bench.fakes.backend import FakeBackend

WEATHER = Function("get_weather", {"type": "object", "additionalProperties": False,
                                   "required": ["city"],
                                   "properties": {"city": {"type": "string"}}}, "the weather")
TIME = Function("get_time", {"type": "object", "properties": {}})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def accepts(tools: Tools, text: str, backend: ChatByteFake | None = None) -> bool:
    """Whether the grammar lets the byte model write `text` and then end."""
    backend = backend or ChatByteFake()
    spec = tool_grammar(tools, tags_are_tokens(backend))
    assert spec is not None
    walk = compile_grammar(spec, backend).start()
    tokens = backend.tokenize(text, add_special=False, parse_special=True)
    return walk.consume(tokens) == len(tokens) and walk.mask().allows(EOG)


def choice(mode: str = AUTO, name: str | None = None, parallel: bool = True) -> Tools:
    return Tools((WEATHER, TIME), ToolChoice(mode, name), parallel)


@pytest.mark.parametrize("tools, text, ok", [
    (choice(), "It is sunny.", True),
    (choice(), CALL, True),
    (choice(), CALL + "\n" + CALL_TIME, True),
    (choice(), "<tool_call> written out as text", False),
    (choice(), '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',
     False),
    (choice(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>', False),
    (choice(), '<tool_call>\n{"name": "send_mail", "arguments": {}}\n</tool_call>', False),
    (choice(REQUIRED), "It is sunny.", False),
    (choice(REQUIRED), CALL_TIME, True),
    (choice(REQUIRED, parallel=False), CALL + "\n" + CALL_TIME, False),
    (choice(REQUIRED, "get_time"), CALL_TIME, True),
    (choice(REQUIRED, "get_time"), CALL, False),
    (choice(REQUIRED, "get_time"), CALL_TIME + "\n" + CALL_TIME, False),
])
def test_the_grammar_of_each_tool_choice(tools, text, ok):
    assert accepts(tools, text) is ok


def test_tool_choice_none_has_no_grammar_and_shows_no_tools():
    tools = choice(NONE)
    assert tool_grammar(tools, True) is None
    messages = [{"role": "user", "content": "hi"}]
    assert prompt_with_tools(ChatByteFake(), messages, tools) == (tuple(messages), ())


def test_the_tags_are_the_vocabularys_own_tokens_where_it_has_them():
    assert tags_are_tokens(ChatByteFake()) and not tags_are_tokens(FakeBackend())
    # Without such tokens the tags are plain text, and the grammar spells them.
    plain = tool_grammar(choice(), tags_are_tokens=False)
    assert plain is not None and '"<tool_call>\\n"' in plain.source


def test_a_template_that_reads_tools_gets_them_and_one_that_does_not_gets_the_hermes_text():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    native, entries = prompt_with_tools(ChatByteFake(), messages, choice())
    assert native == tuple(messages) and [e["function"]["name"] for e in entries] == \
        ["get_weather", "get_time"]
    fallback, entries = prompt_with_tools(FakeBackend(), messages, choice())
    assert entries == () and fallback == tuple(as_text_turns(messages, choice().functions))
    assert fallback[0]["role"] == "system" and fallback[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "get_weather"' in fallback[0]["content"]
    assert fallback[2] == {"role": "assistant", "content": CALL}
    assert fallback[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


def test_an_answer_is_read_as_text_or_calls():
    assert read_answer("It is sunny.") == ("It is sunny.", [])
    content, calls = read_answer(CALL + "\n" + CALL_TIME)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    # Cut off by max_tokens: the complete call, and the rest as it was written.
    content, calls = read_answer(CALL + '\n<tool_call>\n{"name": "get_ti')
    assert len(calls) == 1 and content == '\n<tool_call>\n{"name": "get_ti'


def test_the_streaming_reader_holds_a_call_until_it_is_complete():
    reader = CallReader()
    text = CALL + "\n" + CALL_TIME
    pieces = [p for i in range(0, len(text), 3) for p in reader.push(text[i:i + 3])]
    pieces += reader.finish()
    assert [type(p) for p in pieces] == [Call, Call]
    assert [p.index for p in pieces if isinstance(p, Call)] == [0, 1]
    # Text that cannot be the tag goes out at once, byte for byte.
    reader = CallReader()
    assert reader.push(" <tool") == [] and reader.push("s are") == [Content(" <tools are")]
    assert reader.push(" fun") == [Content(" fun")] and reader.finish() == []
