"""A tiny stand-in for gpt-oss's chat setup (testing/synthetic/models.py writes it into gpt-oss files):
harmony's special tokens, in an order that makes `<|return|>` the end-of-generation id 2, and a short harmony
template with the real one's structure and constructs (a system message with the date and the reasoning
effort, the developer message, `namespace`, list slicing, `raise_exception`, analysis only in a training
render, the generation prompt `<|start|>assistant`)."""

from __future__ import annotations

HARMONY_SPECIALS = [
    "<|endoftext|>", "<|start|>", "<|return|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>",
    "<|constrain|>",
]  # fmt: skip

HARMONY_TEMPLATE = """\
{%- set state = namespace(developer="", loop_messages=messages) -%}
{%- if messages[0].role in ("system", "developer") -%}
  {%- set state.developer = messages[0].content -%}
  {%- set state.loop_messages = messages[1:] -%}
{%- endif -%}
<|start|>system<|message|>You are a tiny model.
Current date: {{ strftime_now("%Y-%m-%d") }}

Reasoning: {{ reasoning_effort | default("medium") }}

# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>
{%- if state.developer -%}
<|start|>developer<|message|># Instructions

{{ state.developer }}<|end|>
{%- endif -%}
{%- for message in state.loop_messages -%}
  {%- if message.role == "user" -%}
<|start|>user<|message|>{{ message.content }}<|end|>
  {%- elif message.role == "assistant" -%}
    {%- if "<|channel|>" in message.content -%}
      {{- raise_exception("pass the analysis text in 'thinking', not in 'content'") -}}
    {%- endif -%}
    {%- if loop.last and not add_generation_prompt and message.thinking is defined -%}
<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>
    {%- endif -%}
<|start|>assistant<|channel|>final<|message|>{{ message.content }}
    {{- "<|return|>" if loop.last and not add_generation_prompt else "<|end|>" -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%}
"""
