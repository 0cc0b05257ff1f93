"""Drive a running sapient server's /v1/responses with the official `openai` Python client.

Run by tests/openai_client.rs, which starts the server (SmolLM2-135M-Instruct, an API key)
and passes OPENAI_BASE_URL, OPENAI_API_KEY and MODEL. Every check raises on failure; the
last line printed is "ok".
"""

import json
import os

import openai
import pydantic

from client_common import WEATHER_PARAMETERS, check

BASE = os.environ["OPENAI_BASE_URL"]
KEY = os.environ["OPENAI_API_KEY"]
MODEL = os.environ["MODEL"]

client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)


# A response, whole.
instructions = "You are a helpful assistant."
r = client.responses.create(model=MODEL, instructions=instructions, input="What is the capital of France?", max_output_tokens=24, temperature=0)
check(r.object == "response" and r.status in ("completed", "incomplete") and r.model == MODEL, r)
check("Paris" in r.output_text, f"answer {r.output_text!r}")
check([o.type for o in r.output] == ["message"], r.output)
check(r.usage.input_tokens > 10 and r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage)
print("response:", repr(r.output_text), r.status)

# Streamed: the events in order, the deltas spell the same text, the last event holds the
# whole response.
types, deltas, done = [], [], None
for ev in client.responses.create(model=MODEL, instructions=instructions, input="What is the capital of France?", max_output_tokens=24, temperature=0, stream=True):
    types.append(ev.type)
    if ev.type == "response.output_text.delta":
        deltas.append(ev.delta)
    if ev.type in ("response.completed", "response.incomplete"):
        done = ev.response
check(types[:2] == ["response.created", "response.in_progress"], types[:3])
check(types[-1] in ("response.completed", "response.incomplete") and "response.output_item.added" in types and "response.output_text.done" in types, types)
check("".join(deltas) == r.output_text and len(deltas) > 3, (deltas, r.output_text))
check(done.output_text == r.output_text and done.usage.output_tokens == r.usage.output_tokens, done)
print("stream: ok,", len(deltas), "deltas")

# Stored: retrievable, and the base of a follow-up through previous_response_id (whose
# prompt holds the first exchange: more input tokens than that exchange had in all).
got = client.responses.retrieve(r.id)
check(got.id == r.id and got.output_text == r.output_text, got)
follow = client.responses.create(model=MODEL, previous_response_id=r.id, input="And of Germany?", max_output_tokens=16, temperature=0)
check(follow.previous_response_id == r.id and follow.output_text, follow)
check(follow.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens, (follow.usage, r.usage))
print("previous_response_id:", repr(follow.output_text))

# Function tools: a forced call, the same call streamed, then its output and the answer.
tools = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER_PARAMETERS,
        "strict": True,
    }
]
ask = "What is the weather like in Paris today?"
r = client.responses.create(model=MODEL, input=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, max_output_tokens=64, temperature=0)
calls = [o for o in r.output if o.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id, r.output)
args = json.loads(calls[0].arguments)
check(isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit") and set(args) == {"city", "unit"}, args)

sargs, sdone = "", None
for ev in client.responses.create(
    model=MODEL, input=ask, tools=tools, tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False, max_output_tokens=64, temperature=0, stream=True
):
    if ev.type == "response.function_call_arguments.delta":
        sargs += ev.delta
    if ev.type == "response.function_call_arguments.done":
        sdone = ev.arguments
check(sargs == sdone == calls[0].arguments, (sargs, sdone, calls[0].arguments))

out = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temperature": 21, "sky": "sunny"})}]
final = client.responses.create(model=MODEL, previous_response_id=r.id, input=out, tools=tools, tool_choice="none", max_output_tokens=48, temperature=0)
check(final.output_text and not any(o.type == "function_call" for o in final.output), final.output)
# The same turn with the call and its output given as input items instead.
again = client.responses.create(
    model=MODEL, input=[{"role": "user", "content": ask}, calls[0].model_dump(exclude_none=True)] + out, tools=tools, tool_choice="none", max_output_tokens=48, temperature=0, store=False
)
check(again.output_text == final.output_text, (again.output_text, final.output_text))
print("tools:", calls[0].arguments, "->", repr(final.output_text))


# Structured output: a JSON schema through text.format (the SDK's parse()).
class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: float


p = client.responses.parse(model=MODEL, input="Describe Paris as JSON with its name, country and population in millions.", text_format=City, max_output_tokens=64, temperature=0)
check(isinstance(p.output_parsed, City), p.output)
print("parse:", p.output_parsed)

# Deleted: gone; unknown ids are 404.
client.responses.delete(r.id)
for fn in (lambda: client.responses.retrieve(r.id), lambda: client.responses.create(model=MODEL, previous_response_id=r.id, input="hi", max_output_tokens=4)):
    try:
        fn()
        raise AssertionError("expected 404")
    except openai.NotFoundError as e:
        check(r.id in e.body["message"], e.body)
print("ok")
