"""The API's OpenAPI 3.0 document, served by `tandem serve` at /openapi.json (with the key, like
every route but /health): the request bodies with every field the server takes and its range
(the rows of app/runtime/ranges.py, the one table the three front ends check against), and every status a route answers with, each
with the OpenAI-style error body (app/serve/errors.py).

The routes read their bodies by hand rather than through pydantic models (every field is used
or refused with a message naming it), so FastAPI cannot derive this document; it is written
here, and tests/test_serve_fuzz.py checks it lists exactly the fields parsing.py takes and
generates requests from it (schemathesis) against a real server.
"""
from __future__ import annotations

from typing import Any

from app.runtime.overflow import POLICIES as OVERFLOW_POLICIES
from app.runtime.defaults import DEFAULT_MAX_TOKENS, REASONING_FORMATS
from app.runtime.ranges import (BY_NAME, CHOICE, FLAG, INTEGER, PREDICTED, SETTINGS, TEXTS,
                                Setting)
from app.runtime.tool_calls import MODES, NAME_PATTERN
from app.serve.responses_request import PASSED as RESPONSES_PASSED
from engine.control.registry import POLICIES

JSON = "application/json"

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": "string", "nullable": True},
                       "code": {"type": "string", "nullable": True}}}},
}


def _error(description: str) -> dict:
    return {"description": description, "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}


# What every route may answer besides its own results: the guard's refusals (access.py) and a
# server still loading its pair or too busy to queue another request.
GUARD = {
    "401": _error("missing or wrong API key"),
    "403": _error("a Host or Origin this server does not answer"),
}
GENERATION_ERRORS = {
    **GUARD,
    "400": _error("a field out of range, of the wrong type, unknown, or JSON that cannot be read"),
    "413": _error("a prompt longer than the context, or a body over 8 MiB"),
    "415": _error("a body not sent as application/json"),
    "503": _error("the pair is still loading, or the queue is full (Retry-After says when to retry)"),
}

# OpenAI's predicted output (a bare string is read as its content too).
TEXT_PART = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
             "properties": {"type": {"type": "string", "enum": ["text"]},
                            "text": {"type": "string"}}}
PREDICTION = {"oneOf": [
    {"type": "object", "required": ["type", "content"], "additionalProperties": False,
     "properties": {"type": {"type": "string", "enum": ["content"]},
                    "content": {"oneOf": [{"type": "string"},
                                          {"type": "array", "minItems": 1, "items": TEXT_PART}]}}},
    {"type": "string"}]}


def _schema(setting: Setting) -> dict:
    """A request setting's schema, from its row in the one table (app/runtime/ranges.py)."""
    schema: dict[str, Any] = {"nullable": True, "description": setting.meaning}
    if setting.kind == CHOICE:
        schema["type"] = "string"
        if setting.name == "policy":
            schema["enum"] = list(POLICIES)
        else:
            schema["description"] += " (one of the loaded pair's drafters: GET /v1/models)"
    elif setting.kind == FLAG:
        schema["type"] = "boolean"
    elif setting.kind == TEXTS:
        schema["oneOf"] = [{"type": "string", "minLength": 1},
                           {"type": "array", "items": {"type": "string", "minLength": 1}}]
    elif setting.kind == PREDICTED:
        schema.update(PREDICTION)
    else:
        schema["type"] = "integer" if setting.kind == INTEGER else "number"
        if setting.low is not None:
            schema["minimum"] = setting.low
            if setting.open_low:
                schema["exclusiveMinimum"] = True
        if setting.high is not None:
            schema["maximum"] = setting.high
            if setting.open_high:
                schema["exclusiveMaximum"] = True
    return schema


SPECULATIVE_PREFIX = "speculative."
TOP_LOGPROBS = BY_NAME["top_logprobs"]
NAME = {"type": "string", "pattern": NAME_PATTERN.pattern}
# Any JSON schema: the constraint engine (llguidance) checks it; one it refuses is a 400.
JSON_SCHEMA = {"type": "object", "description": "a JSON schema"}


def _format(kind: str, **properties: Any) -> dict:
    return {"type": "object", "required": ["type", *properties], "additionalProperties": False,
            "properties": {"type": {"type": "string", "enum": [kind]}, **properties}}


RESPONSE_FORMAT = {
    "nullable": True,
    "description": "text, any JSON object, or JSON following a schema (always enforced, "
                   "strict or not)",
    "oneOf": [_format("text"), _format("json_object"), _format("json_schema", json_schema={
        "type": "object", "required": ["name", "schema"], "additionalProperties": False,
        "properties": {"name": NAME, "description": {"type": "string"},
                       "strict": {"type": "boolean", "nullable": True}, "schema": JSON_SCHEMA}})],
}
TOOL = {
    "type": "object", "required": ["type", "function"], "additionalProperties": False,
    "properties": {"type": {"type": "string", "enum": ["function"]}, "function": {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": NAME, "description": {"type": "string", "nullable": True},
                       "parameters": JSON_SCHEMA,
                       "strict": {"type": "boolean", "nullable": True}}}},
}
TOOL_CHOICE = {"nullable": True, "description": "only with tools", "oneOf": [
    {"type": "string", "enum": list(MODES)},
    {"type": "object", "required": ["type", "function"], "additionalProperties": False,
     "properties": {"type": {"type": "string", "enum": ["function"]},
                    "function": {"type": "object", "required": ["name"],
                                 "additionalProperties": False,
                                 "properties": {"name": NAME}}}}]}
CALL = {
    "type": "object", "required": ["id", "function"], "additionalProperties": False,
    "properties": {"id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
                   "function": {"type": "object", "required": ["name", "arguments"],
                                "additionalProperties": False,
                                "properties": {"name": {"type": "string"},
                                               "arguments": {"type": "string",
                                                             "description": "a JSON object"}}}},
}
SAMPLING: dict[str, Any] = {
    "model": {"type": "string", "description": "any name: the loaded pair answers (the "
                                               "answer's model says which)"},
    **{s.api_field: _schema(s) for s in SETTINGS
       if "." not in s.api_field and s is not TOP_LOGPROBS},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "nullable": True},
    "stream": {"type": "boolean", "nullable": True},
    "stream_options": {"type": "object", "nullable": True, "additionalProperties": False,
                       "properties": {"include_usage": {"type": "boolean"}},
                       "description": "only with stream: true"},
    "n": {"type": "integer", "enum": [1], "nullable": True},
    "speculative": {
        "type": "object", "nullable": True, "additionalProperties": False,
        "properties": {s.api_field.removeprefix(SPECULATIVE_PREFIX): _schema(s)
                       for s in SETTINGS if s.api_field.startswith(SPECULATIVE_PREFIX)}},
}
SAMPLING["max_tokens"]["description"] = (f"default {DEFAULT_MAX_TOKENS}; at most the context "
                                         "(--ctx)")
SAMPLING["response_format"] = RESPONSE_FORMAT
CHAT_ONLY: dict[str, Any] = {
    "logprobs": {"type": "boolean", "nullable": True,
                 "description": "each token's log probability (the target's, at temperature 1)"},
    TOP_LOGPROBS.api_field: {**_schema(TOP_LOGPROBS), "description": "alternatives per token; "
                             "needs logprobs: true"},
    "context_overflow": {"type": "string", "nullable": True, "enum": [*OVERFLOW_POLICIES, None],
                         "description": "when the messages outgrow the context: stop (default, "
                         "a 413), drop-oldest or truncate-middle (turns left out, the system "
                         "prompt kept; the X-Tandem-Dropped-Messages header counts them)"},
    "reasoning_format": {"type": "string", "nullable": True, "enum": [*REASONING_FORMATS, None],
                         "description": "a reasoning model's thinking: deepseek returns it as "
                         "reasoning_content, none leaves it in content (default: the server's "
                         "--reasoning-format)"},
}
# On completions too: the prompt describes the tools, the template's syntax holds the answer.
TOOLS_FIELDS: dict[str, Any] = {
    "tools": {"type": "array", "minItems": 1, "nullable": True, "items": TOOL},
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": {"type": "boolean", "nullable": True,
                            "description": "several calls allowed (default: true with auto, "
                                           "false with required or a named function)"},
}
# The legacy endpoint's `logprobs` is the number of alternatives (the same row).
COMPLETION_ONLY: dict[str, Any] = {"logprobs": {**_schema(TOP_LOGPROBS),
                                                "description": TOP_LOGPROBS.meaning}}

MESSAGE = {
    "type": "object", "required": ["role"], "additionalProperties": False,
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "minItems": 1, "items": CALL,
                       "description": "an assistant's calls (content may then be null)"},
        "tool_call_id": {"type": "string", "description": "on tool messages: the call answered"},
        "reasoning_content": {"type": "string", "description": "on assistant messages: the "
                              "thinking this API returned with the answer"},
        "content": {"nullable": True, "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {
                "type": "object", "required": ["type", "text"], "additionalProperties": False,
                "properties": {"type": {"type": "string", "enum": ["text"]},
                               "text": {"type": "string"}}}}]}},
}

CHAT_REQUEST = {
    "type": "object", "required": ["messages"], "additionalProperties": False,
    "properties": {"messages": {"type": "array", "minItems": 1, "items": MESSAGE}, **SAMPLING,
                   **CHAT_ONLY, **TOOLS_FIELDS},
}
COMPLETION_REQUEST = {
    "type": "object", "required": ["prompt"], "additionalProperties": False,
    "properties": {"prompt": {"oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "maxItems": 1,
         "items": {"type": "string", "minLength": 1}}]}, **SAMPLING, **COMPLETION_ONLY,
                   **TOOLS_FIELDS},
}
RESPONSES_REQUEST = {
    "type": "object", "required": ["input"], "additionalProperties": False,
    "description": "read as the chat request it amounts to (app/serve/responses_request.py)",
    "properties": {
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
            "type": "object", "description": "a message, function_call or "
                                             "function_call_output item"}}]},
        "instructions": {"type": "string", "nullable": True},
        "max_output_tokens": {"type": "integer", "minimum": 1, "nullable": True},
        "tools": {"type": "array", "nullable": True, "description": "an empty list is no tools",
                  "items": {"type": "object",
                            "description": '{"type": "function", "name", "description", '
                                           '"parameters", "strict"}'}},
        "tool_choice": {"nullable": True},
        "parallel_tool_calls": TOOLS_FIELDS["parallel_tool_calls"],
        "text": {"type": "object", "nullable": True,
                 "description": '{"format": {"type": "text|json_object|json_schema", ...}}'},
        "store": {"type": "boolean", "nullable": True,
                  "description": "true (the default): the response is kept for GET, DELETE and "
                                 "previous_response_id; false: nothing is kept"},
        "previous_response_id": {"type": "string", "nullable": True,
                                 "description": "a stored response this one continues"},
        "metadata": {"type": "object", "nullable": True},
        "include": {"type": "array", "maxItems": 0, "nullable": True},
        **{k: v for k, v in SAMPLING.items() if k in RESPONSES_PASSED}},
}
COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices"],
    "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                   "created": {"type": "integer"}, "model": {"type": "string"},
                   "choices": {"type": "array", "minItems": 1, "maxItems": 1},
                   "usage": {"type": "object"}, "speculative": {"type": "object"}},
}


def _generation(summary: str, request: str) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True,
                        "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {
            "200": {"description": "the answer; with stream: true, server-sent events",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Completion"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **GENERATION_ERRORS}}}


def _continued(path: dict) -> dict:
    path["post"]["responses"]["404"] = _error("previous_response_id names no stored response "
                                              "of this key")
    return path


def _stored(summary: str) -> dict:
    return {"summary": summary,
            "parameters": [{"name": "response_id", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": {"description": summary,
                                  "content": {JSON: {"schema": {"type": "object"}}}},
                          "404": _error("no stored response of this key has that id"),
                          **GUARD}}


STORED_RESPONSE = {"get": _stored("a stored response"),
                   "delete": _stored("forget a stored response")}


def document(version: str = "1") -> dict:
    """The OpenAPI document of `tandem serve`."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "Tandem", "version": version,
                 "description": "OpenAI-compatible API over an exact speculative-decoding pair"},
        "paths": {
            "/health": {"get": {"summary": "whether the pair is loaded (no key needed)",
                                "responses": {"200": {"description": "ready",
                                                      "content": {JSON: {"schema": {"type": "object"}}}},
                                              "403": GUARD["403"],
                                              "503": {"description": "loading or failed",
                                                      "content": {JSON: {"schema": {"type": "object"}}}}}}},
            "/v1/models": {"get": {"summary": "the pair served, its drafters",
                                   "responses": {"200": {"description": "the served model",
                                                         "content": {JSON: {"schema": {"type": "object"}}}},
                                                 **GUARD,
                                                 "503": GENERATION_ERRORS["503"]}}},
            "/v1/chat/completions": _generation("a chat answer", "ChatRequest"),
            "/v1/completions": _generation("a raw completion", "CompletionRequest"),
            "/v1/responses": _continued(_generation("a Responses API answer",
                                                    "ResponsesRequest")),
            "/v1/responses/{response_id}": STORED_RESPONSE,
        },
        "components": {"schemas": {"Error": ERROR, "ChatRequest": CHAT_REQUEST,
                                   "CompletionRequest": COMPLETION_REQUEST,
                                   "ResponsesRequest": RESPONSES_REQUEST,
                                   "Completion": COMPLETION}},
    }
