#!/usr/bin/env python3
"""Expected chat-template renderings, made the way HF transformers' `apply_chat_template` renders:
jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols),
`raise_exception`, `strftime_now`, `tojson` = json.dumps(ensure_ascii=False, ...), the
`{% generation %}` tag, and the context `messages`, `tools`, `documents` (None when absent),
`add_generation_prompt`, `bos_token`, `eos_token`.

  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install jinja2==3.1.6
  /tmp/tokvenv/bin/python scripts/tokenizers/render_templates.py
      -> tests/data/tokenizers/rendered.json (templates/*.jinja x conversations.json)
  /tmp/tokvenv/bin/python scripts/tokenizers/render_templates.py --sweep DIR OUT.json
      -> every DIR/*.jinja (e.g. llama.cpp's models/templates) rendered into OUT.json, for
         crates/sapient-tokenizers/tests/reference.rs's opt-in SAPIENT_TEMPLATE_SWEEP check.

`strftime_now` formats the fixed time DATE (UTC) below; the Rust test passes the same time in
RenderOptions::date.
"""
import calendar
import datetime
import json
import os
import sys

import jinja2
from jinja2 import exceptions, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'data', 'tokenizers')
DATE = datetime.datetime(2025, 2, 3, 4, 5, 6)
DATE_UNIX = calendar.timegm(DATE.timetuple())

# name, bos_token, eos_token (as the models' tokenizer_config.json / GGUF metadata give them)
TEMPLATES = [
    ('smollm2', '<|im_start|>', '<|im_end|>'),
    ('qwen2.5', '<|endoftext|>', '<|im_end|>'),
    ('qwen3', None, '<|im_end|>'),
    ('llama3.1', '<|begin_of_text|>', '<|eot_id|>'),
    ('llama3.2', '<|begin_of_text|>', '<|eot_id|>'),
    ('phi3.5', '<s>', '<|endoftext|>'),
    ('mistral-v3', '<s>', '</s>'),
    ('mistral-nemo', '<s>', '</s>'),
    ('gemma2', '<bos>', '<eos>'),
    ('gemma3', '<bos>', '<eos>'),
    ('deepseek-r1-distill-qwen', '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>'),
    ('hermes3-tool-use', '<|begin_of_text|>', '<|im_end|>'),
    ('smollm3', None, '<|im_end|>'),
    ('granite3.3', '<|end_of_text|>', '<|end_of_text|>'),
    ('gpt-oss', '<|startoftext|>', '<|return|>'),
    ('qwen3.5', None, '<|im_end|>'),
]


class AssistantTracker(Extension):
    """transformers' {% generation %} tag: renders its body."""
    tags = {'generation'}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(['name:endgeneration'], drop_needle=True)
        return nodes.CallBlock(self.call_method('_render', []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class Raised(exceptions.TemplateError):
    """What the template's own raise_exception() raises."""


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return DATE.strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[AssistantTracker, jinja2.ext.loopcontrols])
env.filters['tojson'] = tojson
env.globals['raise_exception'] = raise_exception
env.globals['strftime_now'] = strftime_now

convs = json.load(open(os.path.join(DATA, 'conversations.json'), encoding='utf-8'))


# Thinking-mode templates: their conversations (earlier turns with <think> blocks or
# `reasoning_content`) rendered with `enable_thinking` unset, false and true.
THINKING = [('qwen3', None, '<|im_end|>'), ('smollm3', None, '<|im_end|>'), ('qwen3.5', None, '<|im_end|>')]
THINKING_CONVS = 'conversations_thinking.json'


def render_all(source, bos, eos, conversations=None, extra=None):
    t = env.from_string(source)
    out = []
    for i, c in enumerate(conversations if conversations is not None else convs):
        ctx = dict(messages=c['messages'], tools=c.get('tools'), documents=None,
                   add_generation_prompt=c.get('add_generation_prompt', True),
                   bos_token=bos or '', eos_token=eos or '', **(extra or {}))
        try:
            rendered = t.render(**ctx)
        except Raised as e:
            rendered = {'error': str(e)}
        except Exception as e:  # a template bug the reference hits too (e.g. a missing key)
            rendered = {'failure': f'{type(e).__name__}: {e}'}
        out.append((i, rendered))
    return out


def main():
    if len(sys.argv) == 4 and sys.argv[1] == '--sweep':
        src_dir, out_path = sys.argv[2], sys.argv[3]
        out = []
        for name in sorted(os.listdir(src_dir)):
            if not name.endswith('.jinja'):
                continue
            source = open(os.path.join(src_dir, name), encoding='utf-8').read()
            try:
                results = render_all(source, '<s>', '</s>')
            except Exception as e:
                print(f'{name}: reference cannot compile it: {e}')
                continue
            for i, r in results:
                out.append({'template': name, 'path': os.path.abspath(os.path.join(src_dir, name)),
                            'conversation': i, 'bos': '<s>', 'eos': '</s>', 'rendered': r})
        json.dump({'date_unix': DATE_UNIX, 'renderings': out}, open(out_path, 'w', encoding='utf-8'),
                  ensure_ascii=False, indent=1)
        print(len(out), 'renderings ->', out_path)
        return
    out = []
    for name, bos, eos in TEMPLATES:
        source = open(os.path.join(DATA, 'templates', f'{name}.jinja'), encoding='utf-8').read()
        for i, r in render_all(source, bos, eos):
            out.append({'template': name, 'conversation': i, 'bos': bos, 'eos': eos, 'rendered': r})
    thinking = json.load(open(os.path.join(DATA, THINKING_CONVS), encoding='utf-8'))
    for name, bos, eos in THINKING:
        source = open(os.path.join(DATA, 'templates', f'{name}.jinja'), encoding='utf-8').read()
        for extra in ({}, {'enable_thinking': False}, {'enable_thinking': True}):
            for i, r in render_all(source, bos, eos, thinking, extra):
                out.append({'template': name, 'conversations': THINKING_CONVS, 'conversation': i, 'extra': extra,
                            'bos': bos, 'eos': eos, 'rendered': r})
    json.dump({'date_unix': DATE_UNIX, 'renderings': out},
              open(os.path.join(DATA, 'rendered.json'), 'w', encoding='utf-8'), ensure_ascii=False, indent=1)
    print(len(out), 'renderings,', sum('error' in r['rendered'] for r in out if isinstance(r['rendered'], dict)),
          'raise_exception,', sum('failure' in r['rendered'] for r in out if isinstance(r['rendered'], dict)), 'other errors')


if __name__ == '__main__':
    main()
