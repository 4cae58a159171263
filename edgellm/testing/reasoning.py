"""A chat template with a thinking switch, the reasoning budget and a question, shared by the reasoning
tests of the LLM, the server and the other APIs."""

from __future__ import annotations

THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)


BUDGET = 6


ASK = [{"role": "user", "content": "Is the cat in the world?"}]
