"""Drive a running sapient server with the official `openai` Python client.

Run by tests/openai_client.rs, which starts the server (SmolLM2-135M-Instruct, an API key,
a small queue and body limit) and passes OPENAI_BASE_URL, OPENAI_API_KEY and MODEL.
Every check raises on failure; the last line printed is "ok".
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


# Models.
ids = [m.id for m in client.models.list().data]
check(ids == [MODEL], f"models {ids}")

# Chat, whole.
question = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0)
answer = r.choices[0].message.content
check("Paris" in answer, f"answer {answer!r}")
check(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
check(r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0, r.usage)
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
print("chat:", repr(answer))

# Chat, streamed with usage: the same text.
pieces, usage, reasons = [], None, []
for chunk in client.chat.completions.create(
    model=MODEL, messages=question, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            reasons.append(c.finish_reason)
check("".join(pieces) == answer, f"streamed {''.join(pieces)!r} vs {answer!r}")
check(len(pieces) > 3, "streamed in pieces")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage)
check(reasons == [r.choices[0].finish_reason], reasons)
print("stream: ok,", len(pieces), "pieces")

# Log-probabilities, whole and streamed: one entry per token, the chosen one first among
# its alternatives (greedy), and the same in both.
lp = client.chat.completions.create(model=MODEL, messages=question, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens, f"{len(content)} logprobs for {lp.usage.completion_tokens} tokens")
check(all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token and t.logprob <= 0 for t in content), content[:2])
check(bytes(b for t in content for b in t.bytes).decode("utf-8", "replace").strip() == lp.choices[0].message.content.strip(), "tokens spell the answer")
streamed = []
for chunk in client.chat.completions.create(model=MODEL, messages=question, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3, stream=True):
    for c in chunk.choices:
        if c.logprobs and c.logprobs.content:
            streamed.extend(c.logprobs.content)
check([(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content], "streamed logprobs")
print("logprobs: ok,", len(content), "tokens")

# Completions.
c = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=16, temperature=0)
check(len(c.choices[0].text) > 0 and c.choices[0].finish_reason in ("stop", "length"), c)

# Structured output: a Pydantic model through parse().
class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: float


parse = client.chat.completions.parse if hasattr(client.chat.completions, "parse") else client.beta.chat.completions.parse
p = parse(
    model=MODEL,
    messages=[{"role": "user", "content": "Describe Paris as JSON with its name, country and population in millions."}],
    response_format=City,
    max_tokens=64,
    temperature=0,
)
city = p.choices[0].message.parsed
check(isinstance(city, City), f"parsed {p.choices[0].message}")
print("parse:", city)

# Tools: a call, its result, the final answer.
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    }
]
ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
r = client.chat.completions.create(
    model=MODEL, messages=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=64, temperature=0
)
check(r.choices[0].finish_reason == "tool_calls", r)
call = r.choices[0].message.tool_calls[0]
args = json.loads(call.function.arguments)
check(call.function.name == "get_weather" and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit"), args)

# Streamed, the same call assembled from tool_calls deltas.
name, sargs = "", ""
for chunk in client.chat.completions.create(
    model=MODEL, messages=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=64, temperature=0, stream=True
):
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            name += tc.function.name or ""
            sargs += tc.function.arguments or ""
check(name == "get_weather" and sargs == call.function.arguments, (name, sargs))

turns = ask + [
    r.choices[0].message.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
]
final = client.chat.completions.create(model=MODEL, messages=turns, tools=tools, tool_choice="none", max_tokens=48, temperature=0)
check(final.choices[0].message.content and not final.choices[0].message.tool_calls, final)
print("tools:", call.function.arguments, "->", repr(final.choices[0].message.content))

# A free-form object argument (`{"type": "object"}`, as `kwargs` or `metadata` in real tool
# definitions) carries whatever the model writes into it.
run = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command with options",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "maxLength": 20}, "kwargs": {"type": "object"}},
                "required": ["command", "kwargs"],
            },
        },
    }
]
ask = [{"role": "user", "content": 'Call run with command "ls" and kwargs {"all": true, "depth": 2}.'}]
r = client.chat.completions.create(model=MODEL, messages=ask, tools=run, tool_choice="required", max_tokens=64, temperature=0)
args = json.loads(r.choices[0].message.tool_calls[0].function.arguments)
check(isinstance(args["kwargs"], dict) and len(args["kwargs"]) > 0, args)
print("free-form object:", args)

# Errors, each with its status and OpenAI's shape.
def expect(exc, status, fn):
    try:
        fn()
    except exc as e:
        check(e.status_code == status, f"{exc.__name__}: status {e.status_code}")
        check(isinstance(e.body, dict) and "message" in e.body, f"error body {e.body}")
        return e
    raise AssertionError(f"expected {exc.__name__} ({status})")


expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=MODEL, messages=question, temperature=7))
e = expect(
    openai.BadRequestError,
    400,
    lambda: client.chat.completions.create(
        model=MODEL,
        messages=question,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "contains": {"type": "integer"}}}},
    ),
)
check("contains" in e.body["message"], e.body)
expect(openai.NotFoundError, 404, lambda: client.chat.completions.create(model="gpt-4o", messages=question))
bad_key = openai.OpenAI(base_url=BASE, api_key="wrong", max_retries=0)
expect(openai.AuthenticationError, 401, lambda: bad_key.models.list())
expect(openai.APIStatusError, 413, lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 100_000}]))
expect(openai.RateLimitError, 429, lambda: client.chat.completions.create(model=MODEL, messages=question, n=3, max_tokens=4))
print("errors: ok")
print("ok")
