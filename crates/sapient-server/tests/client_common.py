"""What the client scripts (openai_client.py, responses_client.py, anthropic_client.py)
share: the check that raises, and the weather tool's parameter schema."""

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
