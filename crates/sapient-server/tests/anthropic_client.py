"""Drive a running sapient server's /v1/messages with the official `anthropic` Python client.

Run by tests/openai_client.rs, which starts the server (SmolLM2-135M-Instruct, an API key)
and passes ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY and MODEL. Every check raises on failure;
the last line printed is "ok".
"""

import json
import os

import anthropic
import pydantic

from client_common import WEATHER_PARAMETERS, check

BASE = os.environ["ANTHROPIC_BASE_URL"]
KEY = os.environ["ANTHROPIC_API_KEY"]
MODEL = os.environ["MODEL"]

client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
# This SDK's create() has no sampling arguments any more; the API (and this server) takes
# them in the body.
GREEDY = {"temperature": 0}


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


# A message, whole.
system = "You are a helpful assistant."
question = [{"role": "user", "content": "What is the capital of France?"}]
r = client.messages.create(model=MODEL, system=system, messages=question, max_tokens=24, extra_body=GREEDY)
answer = text_of(r)
check(r.type == "message" and r.role == "assistant" and r.model == MODEL, r)
check("Paris" in answer, f"answer {answer!r}")
check(r.stop_reason in ("end_turn", "max_tokens"), r.stop_reason)
prompt_tokens = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
check(prompt_tokens > 10 and r.usage.output_tokens > 0, r.usage)
print("message:", repr(answer), r.stop_reason)

# count_tokens: the prompt the message was answered from.
n = client.messages.count_tokens(model=MODEL, system=system, messages=question)
check(n.input_tokens == prompt_tokens, f"count_tokens {n.input_tokens} vs {prompt_tokens}")
print("count_tokens:", n.input_tokens)

# Streamed through the SDK's accumulating helper: the same text, stop reason and usage;
# the raw event sequence in Anthropic's order.
events = []
with client.messages.stream(model=MODEL, system=system, messages=question, max_tokens=24, extra_body=GREEDY) as s:
    for ev in s:
        events.append(ev.type)
    final = s.get_final_message()
check(text_of(final) == answer, f"streamed {text_of(final)!r} vs {answer!r}")
check(final.stop_reason == r.stop_reason and final.usage.output_tokens == r.usage.output_tokens, final)
raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop", "ping")]
check(raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"], raw)
check(raw.count("content_block_start") == raw.count("content_block_stop") == 1 and raw.count("content_block_delta") > 3, raw)
print("stream: ok,", raw.count("content_block_delta"), "deltas")

# A stop sequence taken from the answer: the answer stops before it and names it.
word = answer.split()[len(answer.split()) // 2]
cut = client.messages.create(model=MODEL, system=system, messages=question, max_tokens=24, extra_body=GREEDY, stop_sequences=["@@never@@", word])
check(cut.stop_reason == "stop_sequence" and cut.stop_sequence == word, (cut.stop_reason, cut.stop_sequence, word))
check(text_of(cut).rstrip() == answer[: answer.find(word)].rstrip(), (text_of(cut), word))
print("stop_sequence:", repr(word))

# Tools: a forced call whose input follows the schema, the same call streamed, then its
# result and the final answer.
tools = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": WEATHER_PARAMETERS,
    }
]
ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
r = client.messages.create(
    model=MODEL, messages=ask, tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True}, max_tokens=64, extra_body=GREEDY
)
check(r.stop_reason == "tool_use", r)
uses = [b for b in r.content if b.type == "tool_use"]
check(len(uses) == 1 and uses[0].name == "get_weather", r.content)
args = uses[0].input
check(isinstance(args["city"], str) and len(args["city"]) <= 30 and args["unit"] in ("celsius", "fahrenheit") and set(args) == {"city", "unit"}, args)

with client.messages.stream(
    model=MODEL, messages=ask, tools=tools, tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, max_tokens=64, extra_body=GREEDY
) as s:
    streamed = s.get_final_message()
suses = [b for b in streamed.content if b.type == "tool_use"]
check(streamed.stop_reason == "tool_use" and len(suses) == 1 and suses[0].input == args, streamed)

turns = ask + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": json.dumps({"temperature": 21, "sky": "sunny"})}]},
]
final = client.messages.create(model=MODEL, messages=turns, tools=tools, tool_choice={"type": "none"}, max_tokens=48, extra_body=GREEDY)
check(text_of(final) and not any(b.type == "tool_use" for b in final.content), final)
check(final.stop_reason in ("end_turn", "max_tokens"), final.stop_reason)
print("tools:", args, "->", repr(text_of(final)))

# Structured output: a Pydantic model through parse() (output_config.format's JSON schema).
class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: float


p = client.messages.parse(
    model=MODEL,
    messages=[{"role": "user", "content": "Describe Paris as JSON with its name, country and population in millions."}],
    output_format=City,
    max_tokens=64,
    extra_body=GREEDY,
)
check(isinstance(p.parsed_output, City), p.content)
print("parse:", p.parsed_output)

# Thinking switched off is accepted (the template gets enable_thinking: false).
t = client.messages.create(model=MODEL, messages=question, max_tokens=8, extra_body=GREEDY, thinking={"type": "disabled"})
check(t.content and t.content[0].type == "text", t)


# Errors, each with its status and Anthropic's shape.
def expect(exc, status, kind, fn):
    try:
        fn()
    except exc as e:
        check(e.status_code == status, f"{exc.__name__}: status {e.status_code}")
        check(isinstance(e.body, dict) and e.body.get("type") == "error" and e.body["error"]["type"] == kind, f"error body {e.body}")
        return e
    raise AssertionError(f"expected {exc.__name__} ({status})")


expect(anthropic.BadRequestError, 400, "invalid_request_error", lambda: client.messages.create(model=MODEL, messages=question, max_tokens=8, extra_body={"temperature": 7}))
e = expect(anthropic.BadRequestError, 400, "invalid_request_error", lambda: client.messages.create(model=MODEL, messages=[{"role": "robot", "content": "hi"}], max_tokens=8))
check("robot" in e.body["error"]["message"], e.body)
expect(anthropic.NotFoundError, 404, "not_found_error", lambda: client.messages.create(model="claude-sonnet-4-5", messages=question, max_tokens=8))
bad_key = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
expect(anthropic.AuthenticationError, 401, "authentication_error", lambda: bad_key.messages.create(model=MODEL, messages=question, max_tokens=8))
print("errors: ok")
print("ok")
