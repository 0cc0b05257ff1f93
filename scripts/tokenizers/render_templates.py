#!/usr/bin/env python3
"""Render the chat templates in tests/data/tokenizers/templates/ the way HF transformers'
`apply_chat_template` does (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
raise_exception, tojson = json.dumps(ensure_ascii=False)), for the conversations in
tests/data/tokenizers/conversations.json. Writes tests/data/tokenizers/rendered.json.
Run with jinja2 installed in a venv outside the repo."""
import json
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2 import exceptions

def raise_exception(msg):
    raise exceptions.TemplateError(msg)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters['tojson'] = tojson
env.globals['raise_exception'] = raise_exception
convs = json.load(open('tests/data/tokenizers/conversations.json'))
out = []
for name, bos, eos in [('smollm2', '<|im_start|>', '<|im_end|>'), ('qwen2.5', '<|endoftext|>', '<|im_end|>'),
                       ('qwen3', None, '<|im_end|>'), ('llama3.2', '<|begin_of_text|>', '<|eot_id|>'),
                       ('phi3', '<s>', '<|endoftext|>')]:
    t = env.from_string(open(f'tests/data/tokenizers/templates/{name}.jinja').read())
    for i, c in enumerate(convs):
        ctx = dict(messages=c['messages'], add_generation_prompt=c.get('add_generation_prompt', True),
                   bos_token=bos or '', eos_token=eos or '')
        if c.get('tools'):
            ctx['tools'] = c['tools']
        # Pin the date for templates that print today's date.
        ctx['date_string'] = '26 Jul 2024'
        try:
            rendered = t.render(**ctx)
        except exceptions.TemplateError as e:
            rendered = {'error': str(e)}
        out.append({'template': name, 'conversation': i, 'bos': bos, 'eos': eos, 'rendered': rendered})
json.dump(out, open('tests/data/tokenizers/rendered.json', 'w'), ensure_ascii=False, indent=1)
print(len(out), 'renderings')
