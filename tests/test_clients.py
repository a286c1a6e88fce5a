"""The clients people use, against `tandem serve` (issue 48): openai, instructor, pydantic-ai,
langchain-openai and the OpenAI Agents SDK (chat completions and Responses), none written here.
Each: a tool call under `auto`, the tool's answer fed back and the final text; `required` with
exactly one call; a structured output; streaming.

The short form runs in the default suite on a fake pair that answers as a small tool-using
model does (tests/agent_fake.py: its calls in Qwen2.5-Coder's fenced JSON, as the embedded
target writes them). The full form, `long`, runs the same clients on the embedded pair."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import instructor
import openai
import pytest
from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                    function_tool, set_tracing_disabled)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.test_serve_security import KEY, Server

set_tracing_disabled(True)
WEATHER_Q = "What is the weather in Paris right now?"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "The current weather in a city"}}]
SUNNY = "Sunny, 21 C"
# An agent's instructions, as its author writes them.
INSTRUCTIONS = "You are a helpful assistant. Answer the user's question from the tools' results."


class City(BaseModel):
    name: str
    country: str


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server("serve", tmp_path_factory.mktemp("clients"), env={"TANDEM_FAKE_PAIR": "agent"})
    yield s.url + "/v1"
    s.stop()


def sync_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)


# --- the checks, shared by the short form and the long one ----------------------------------

def openai_round_trip(url: str, model: str) -> str:
    """A call under auto, the tool's answer fed back, the final text."""
    client = sync_client(url)
    messages: list = [{"role": "user", "content": WEATHER_Q}]
    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           max_tokens=200)
    [call] = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": SUNNY}]
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           max_tokens=200)
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    return final.choices[0].message.content


def openai_streamed_call(url: str, model: str) -> dict:
    """A call under auto, streamed: its name first, its arguments as they are drawn."""
    stream = sync_client(url).chat.completions.create(
        model=model, messages=[{"role": "user", "content": WEATHER_Q}], tools=TOOLS,
        max_tokens=200, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(delta.index, {"name": None, "arguments": ""})
            entry["name"] = entry["name"] or (delta.function.name if delta.function else None)
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls" and len(calls) == 1
    return calls[0]


def langchain_required(url: str, model: str, stream: bool) -> list:
    chat = ChatOpenAI(base_url=url, api_key=KEY, model=model, max_retries=0, timeout=600,
                      max_tokens=200).bind_tools([add], tool_choice="required")
    ask = "What is 17 plus 25?"
    if not stream:
        return chat.invoke(ask).tool_calls
    chunks = list(chat.stream(ask))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    return whole.tool_calls


def pydantic_ai_agent(url: str, model: str) -> tuple[list[str], str]:
    calls: list[str] = []
    agent = PydanticAgent(OpenAIChatModel(model, provider=OpenAIProvider(
        openai_client=async_client(url))), instructions=INSTRUCTIONS)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return SUNNY

    return calls, agent.run_sync(WEATHER_Q).output


def agents_sdk(url: str, model: str, responses: bool) -> tuple[list[str], str]:
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return SUNNY

    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="weather", instructions=INSTRUCTIONS,
                  tools=[get_weather], model=kind(model=model, openai_client=async_client(url)))
    result = asyncio.run(Runner.run(agent, WEATHER_Q))
    return calls, result.final_output


CHAIN = ["What is the capital of France?", "And of Italy?", "And of Spain?"]


@dataclass(frozen=True)
class Turn:
    """One turn of a chained run: its answer, the time to its first text delta (a measurement,
    never asserted), and its prompt and the part of it the slot's KV cache held."""
    output: str
    ttft_s: float
    input_tokens: int
    cached_tokens: int


def agents_sdk_chain(url: str, model: str, questions: list[str] = CHAIN) -> list[Turn]:
    """The Agents SDK, unmodified, streaming turns each chained to the last by
    `previous_response_id` (only the new question goes out; the server keeps the rest)."""
    agent = Agent(name="chat", instructions=INSTRUCTIONS,
                  model=OpenAIResponsesModel(model=model, openai_client=async_client(url)))

    async def run() -> list[Turn]:
        turns: list[Turn] = []
        previous = None
        for question in questions:
            started, first = time.perf_counter(), None
            result = Runner.run_streamed(agent, question, previous_response_id=previous)
            async for event in result.stream_events():
                if first is None and event.type == "raw_response_event" \
                        and event.data.type == "response.output_text.delta":
                    first = time.perf_counter() - started
            assert first is not None and result.last_response_id, question
            usage = result.raw_responses[-1].usage
            turns.append(Turn(str(result.final_output), first, usage.input_tokens,
                              usage.input_tokens_details.cached_tokens))
            previous = result.last_response_id
        return turns

    return asyncio.run(run())


def chain_line(turns: list[Turn]) -> str:
    """The chained run's figures, as the tests print them."""
    parts = [f"turn {i}: TTFT {t.ttft_s * 1000:.0f} ms, {t.cached_tokens} of {t.input_tokens} "
             "prompt tokens cached" for i, t in enumerate(turns, 1)]
    return "; ".join(parts) + f"; turn 3 / turn 2 TTFT {turns[2].ttft_s / turns[1].ttft_s:.2f}"


# --- the short form, on the fake pair --------------------------------------------------------

def test_openai_a_call_under_auto_then_the_final_text(server):
    assert openai_round_trip(server, "any-model-name") == f"The tool says: {SUNNY}"


def test_openai_required_gives_exactly_one_call_and_streams_it(server):
    out = sync_client(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": WEATHER_Q}], tools=TOOLS,
        tool_choice="required", max_tokens=200)
    assert len(out.choices[0].message.tool_calls) == 1
    call = openai_streamed_call(server, "m")
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


def test_openai_structured_output(server):
    out = sync_client(server).chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "Paris in JSON"}], response_format=City,
        max_tokens=200)
    assert out.choices[0].message.parsed == City(name="Paris", country="France")


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_structured_output(server, mode):
    client = instructor.from_openai(sync_client(server), mode=mode)
    city = client.chat.completions.create(model="m", response_model=City, max_retries=0,
                                          max_tokens=200,
                                          messages=[{"role": "user", "content": "Paris in JSON"}])
    assert city.model_dump() == {"name": "Paris", "country": "France"}


def test_pydantic_ai_calls_its_tool_under_auto_and_finishes_with_its_answer(server):
    calls, output = pydantic_ai_agent(server, "m")
    assert calls == ["Paris"] and output == f"The tool says: {SUNNY}"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_langchain_required_gives_one_call_not_four(server, stream):
    calls = langchain_required(server, "m", stream)
    assert [(c["name"], c["args"]) for c in calls] == [("add", {"a": 17, "b": 25})]


def test_langchain_structured_output(server):
    chat = ChatOpenAI(base_url=server, api_key=KEY, model="m", max_retries=0, max_tokens=200)
    assert chat.with_structured_output(City).invoke("Paris in JSON") == \
        City(name="Paris", country="France")


@pytest.mark.parametrize("responses", [False, True], ids=["chat-completions", "responses"])
def test_the_agents_sdk_calls_its_tool_under_auto_and_finishes_with_its_answer(server, responses):
    calls, output = agents_sdk(server, "m", responses)
    assert calls == ["Paris"] and output == f"The tool says: {SUNNY}"


def test_an_agents_sdk_run_of_three_turns_chained_by_previous_response_id_reuses_the_cache(
        server, capsys):
    turns = agents_sdk_chain(server, "m")
    with capsys.disabled():
        print(f"\nAgents SDK chain (fake pair): {chain_line(turns)}")
    assert [t.output for t in turns] == ["Paris is the capital of France."] * 3
    # Each turn's prompt holds the one before it, answer included, and its slot kept it.
    # The first turn continues nothing: the shared server's slots may hold an earlier test's
    # request, whose first template tokens it can share (CI saw 1 of 137), never its prompt whole.
    assert turns[0].cached_tokens < turns[0].input_tokens
    for before, turn in zip(turns, turns[1:]):
        assert turn.input_tokens > before.input_tokens
        assert before.input_tokens <= turn.cached_tokens < turn.input_tokens
