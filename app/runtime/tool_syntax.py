"""The table of tool-call syntaxes, one row per chat-template family, and which row a template
is: what a model writes when it calls a tool, in its own words.

A row is one or more forms. A JSON form writes each call as an object
`{"name": ..., "<key>": {arguments}}` between its `call_open` and `call_close` pieces, the block
of calls between `head` and `tail`, the calls separated by `sep`; the XML form (Qwen3-Coder's)
writes `<function=NAME>` and one `<parameter=P>` per argument. Pieces are literal text with any
whitespace allowed between them; a piece that is a control token of the vocabulary
(`<tool_call>` in Qwen's, `[TOOL_CALLS]` in Mistral's) is that token. A call begins (its
trigger) once the pieces up to its function's name and a tool's name are written: JSON that names
no tool offered is text. A bare form (no tag, no fence) is a call only at the answer's start, as
llama.cpp reads one (common/chat.cpp): a text answer may quote JSON, even a call, and stay text.

| row      | templates                     | forms                                                  |
|----------|-------------------------------|--------------------------------------------------------|
| coder    | Qwen2.5-Coder                 | as hermes, and each with the braces doubled            |
|          |                               | (`{{"name": ..., "arguments": {...}}}`, as its template |
|          |                               | shows the call); its tools hidden after their results  |
| hermes   | Hermes, Qwen2.5               | `<tool_call>{...}</tool_call>`, `<tools>{...}</tools>`, |
|          |                               | a ```json fence, the bare object (how Qwen2.5-Coder    |
|          |                               | answers: the last three)                               |
| llama3   | Llama 3.1 / 3.2 / 3.3         | the bare `{"name": ..., "parameters": {...}}`          |
| mistral  | Mistral (v3 tokenizer)        | `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` |
| qwen3xml | Qwen3-Coder                   | `<tool_call><function=NAME><parameter=P>v</parameter>` |

A template is matched to its row by what it writes when handed tools (`detect`): the first row
whose marker the rendered prompt holds, else hermes (also the text fallback of a template that
does not read tools at all, app/runtime/tool_calls.py).

`tools_after_results`: whether the model is shown its tools on the turn after their results.
Qwen2.5-Coder-1.5B, shown them, calls the tool it has just had the answer of again instead of
answering (greedy, and 4 of 4 seeded draws at T 0.7, "What is the weather in Paris right now?"
after "Sunny, 21 C"); with the turns as text and no tools it answers from the result (greedy, and
3 of 4 draws). Its row hides them there: the conversation goes to the template as text, and an
answer that is wholly a call is still read as one. Its template is known by the doubled braces
of its example call (`{{"name": <function-name>, ...}}`), which Qwen2.5's does not have.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

HERMES, CODER, LLAMA3, MISTRAL, QWEN3_XML = "hermes", "coder", "llama3", "mistral", "qwen3xml"


@dataclass(frozen=True)
class Form:
    """One way of writing calls (see the module's table)."""
    name: str
    call_open: tuple[str, ...] = ()
    call_close: tuple[str, ...] = ()
    head: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    sep: tuple[str, ...] = ()
    # The key of the arguments object: "arguments", or Llama 3.1's "parameters".
    key: str = "arguments"
    xml: bool = False
    # Read only at the answer's start (after whitespace): a bare object.
    anchored: bool = False

    @property
    def trigger(self) -> tuple[str, ...]:
        """The pieces that say a call has begun: everything up to the function's name."""
        name_open = ("<function=",) if self.xml else ("{", '"name"', ":", '"')
        return self.head + self.call_open + name_open

    @property
    def name_close(self) -> str:
        """What ends a function's name after the trigger."""
        return ">" if self.xml else '"'

    @property
    def pieces(self) -> tuple[str, ...]:
        return self.head + self.call_open + self.call_close + self.tail + self.sep


@dataclass(frozen=True)
class Syntax:
    """One row of the table: the forms a template family's models write calls in, the first
    the one its template teaches."""
    name: str
    forms: tuple[Form, ...]
    # Text the template writes when it is handed tools (how `detect` knows it).
    markers: tuple[str, ...] = ()
    # Whether the tools are shown on the turn after their results (the module's docstring).
    tools_after_results: bool = True


TOOL_CALL = Form("tool_call", call_open=("<tool_call>",), call_close=("</tool_call>",))
HERMES_FORMS = (TOOL_CALL, Form("tools", call_open=("<tools>",), call_close=("</tools>",)),
                Form("fence", call_open=("```json",), call_close=("```",)),
                Form("bare", anchored=True))


def doubled(form: Form) -> Form:
    """The form with the call's braces doubled, as a Jinja string writes `{{...}}`: one more
    brace opens before the call's object and closes after it."""
    return replace(form, name=form.name + "_doubled", call_open=form.call_open + ("{",),
                   call_close=("}",) + form.call_close)


CODER_FORMS = tuple(f for form in HERMES_FORMS for f in (form, doubled(form)))
SYNTAXES = (
    Syntax(QWEN3_XML, (Form("xml", call_open=("<tool_call>",), call_close=("</tool_call>",),
                            xml=True),), ("<function=", "<parameter=")),
    Syntax(MISTRAL, (Form("mistral", head=("[TOOL_CALLS]", "["), tail=("]",), sep=(",",)),),
           ("[AVAILABLE_TOOLS]",)),
    Syntax(LLAMA3, (Form("llama3", key="parameters", anchored=True),),
           ('"parameters": dictionary of argument name',)),
    Syntax(CODER, CODER_FORMS, ('{{"name": <function-name>', "<tool_call>"),
           tools_after_results=False),
    Syntax(HERMES, HERMES_FORMS, ("<tool_call>",)),
)
BY_NAME = {s.name: s for s in SYNTAXES}


def detect(rendered: str) -> Syntax:
    """The row of a template, from the prompt it renders with tools."""
    for syntax in SYNTAXES:
        if all(m in rendered for m in syntax.markers):
            return syntax
    return BY_NAME[HERMES]


def as_read(syntax: Syntax, silent: set[str]) -> Syntax:
    """The syntax as the answer's text shows it: without the pieces that are control tokens the
    vocabulary writes as nothing (Mistral's `[TOOL_CALLS]`), which the grammar still holds."""
    def strip(pieces: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(p for p in pieces if p not in silent)
    forms = tuple(replace(f, head=strip(f.head), call_open=strip(f.call_open),
                          call_close=strip(f.call_close), tail=strip(f.tail), sep=strip(f.sep))
                  for f in syntax.forms)
    return replace(syntax, forms=forms)
