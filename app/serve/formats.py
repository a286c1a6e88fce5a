"""Readers of the request fields that shape the answer: `response_format` (text, any JSON object,
a JSON schema) and `tools`, `tool_choice`, `parallel_tool_calls` (app/runtime/tool_calls.py).
Each returns the engine's value or raises a 400 naming the field (`param`) in one line. The
schemas themselves are checked by the constraint engine when the pair compiles them
(app/serve/routes.py `prepared`), before the request is queued."""
from __future__ import annotations

from typing import Any

from app.runtime.tool_calls import AUTO, MODES, NAME_PATTERN, REQUIRED, Function, ToolChoice, Tools
from app.serve.errors import BadRequestError
from app.serve.fields import boolean, refuse_unknown
from engine.errors import GrammarError
from engine.grammar.spec import JSON_OBJECT, GrammarSpec

FORMAT_TYPES = ("text", "json_object", "json_schema")
JSON_SCHEMA_FIELDS = ("name", "schema", "strict", "description")
TOOL_FIELDS = ("type", "function")
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


def _object(value: Any, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise BadRequestError(f"{where} must be {what}, got {type(value).__name__}", param=where)
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise BadRequestError(f"{where} must be a name of 1 to 64 letters, digits, _ or -, got "
                              f"{value!r:.80}", param=where)
    return value


def response_format(value: Any) -> GrammarSpec | None:
    """The grammar `response_format` asks for; None for text (or absent)."""
    if value is None:
        return None
    where = "response_format"
    fmt = _object(value, where, 'an object like {"type": "json_object"}')
    kind = fmt.get("type")
    if kind not in FORMAT_TYPES:
        raise BadRequestError(f"{where}.type must be one of {', '.join(FORMAT_TYPES)}, got "
                              f"{kind!r:.80}", param=f"{where}.type")
    refuse_unknown(fmt, ("type", kind) if kind == "json_schema" else ("type",), prefix=where + ".")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(JSON_OBJECT)
    where += ".json_schema"
    spec = _object(fmt.get("json_schema"), where,
                   'an object with "name" and "schema" (and optionally "strict", "description")')
    refuse_unknown(spec, JSON_SCHEMA_FIELDS, prefix=where + ".")
    _name(spec.get("name"), where + ".name")
    boolean(spec, "strict", True, name=where + ".strict")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise BadRequestError(f"{where}.description must be a string", param=where + ".description")
    if "schema" not in spec or not isinstance(spec["schema"], (dict, bool)):
        raise BadRequestError(f"{where}.schema must be a JSON schema (an object)",
                              param=where + ".schema")
    try:
        return GrammarSpec.schema(spec["schema"])
    except GrammarError as exc:
        raise BadRequestError(str(exc), param=where + ".schema") from None


def tools(body: dict) -> Tools | None:
    """The tools a chat request offers and how the model may use them; None without tools."""
    value, choice_value = body.get("tools"), body.get("tool_choice")
    asked = body.get("parallel_tool_calls")
    asked = None if asked is None else boolean(body, "parallel_tool_calls", True)
    if value is None:
        if choice_value is not None:
            raise BadRequestError("tool_choice is only allowed with tools", param="tool_choice")
        if body.get("parallel_tool_calls") is not None:
            raise BadRequestError("parallel_tool_calls is only allowed with tools",
                                  param="parallel_tool_calls")
        return None
    if not isinstance(value, list) or not value:
        raise BadRequestError("tools must be a non-empty list of "
                              '{"type": "function", "function": {...}}', param="tools")
    functions: list[Function] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        tool = _object(tool, where, 'an object {"type": "function", "function": {...}}')
        refuse_unknown(tool, TOOL_FIELDS, prefix=where + ".")
        if tool.get("type") != "function":
            raise BadRequestError(f"{where}.type must be 'function', got {tool.get('type')!r:.80}",
                                  param=f"{where}.type")
        where += ".function"
        function = _object(tool.get("function"), where,
                           'an object with "name" and optionally "description", "parameters"')
        refuse_unknown(function, FUNCTION_FIELDS, prefix=where + ".")
        name = _name(function.get("name"), where + ".name")
        if any(f.name == name for f in functions):
            raise BadRequestError(f"{where}.name {name!r} is given twice", param=where + ".name")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequestError(f"{where}.description must be a string",
                                  param=where + ".description")
        # Absent: enforced (a small model keeps to the schema only when held to it).
        strict = boolean(function, "strict", True, name=where + ".strict")
        # No parameters: the function takes none (an empty object), as OpenAI reads it.
        parameters = function.get("parameters")
        parameters = ({"type": "object", "properties": {}} if parameters is None
                      else _object(parameters, where + ".parameters", "a JSON schema (an object)"))
        functions.append(Function(name, parameters, description, strict))
    choice = _tool_choice(choice_value, functions)
    # OpenAI's default, parallel calls, for `auto`; `required` and a named function give one
    # call unless parallel calls are asked for.
    parallel = asked if asked is not None else (choice.mode == AUTO and choice.name is None)
    return Tools(tuple(functions), choice, parallel)


def _tool_choice(value: Any, functions: list[Function]) -> ToolChoice:
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        if value not in MODES:
            raise BadRequestError(f"tool_choice must be one of {', '.join(MODES)} or "
                                  '{"type": "function", "function": {"name": ...}}, got '
                                  f"{value!r:.80}", param="tool_choice")
        return ToolChoice(value)
    choice = _object(value, "tool_choice", 'a mode or {"type": "function", "function": '
                     '{"name": ...}}')
    refuse_unknown(choice, TOOL_FIELDS, prefix="tool_choice.")
    if choice.get("type") != "function":
        raise BadRequestError(f"tool_choice.type must be 'function', got "
                              f"{choice.get('type')!r:.80}", param="tool_choice.type")
    function = _object(choice.get("function"), "tool_choice.function", 'an object {"name": ...}')
    refuse_unknown(function, ("name",), prefix="tool_choice.function.")
    name = function.get("name")
    names = [f.name for f in functions]
    if name not in names:
        raise BadRequestError(f"tool_choice names function {name!r:.80}, which is not in tools "
                              f"({', '.join(names)})", param="tool_choice.function.name")
    # A named function: the model must call it (OpenAI's forced function).
    return ToolChoice(REQUIRED, name)

