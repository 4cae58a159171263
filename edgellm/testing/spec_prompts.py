"""The prompts of the speculative-decoding benchmarks (scripts/bench/bench_speculative.py and
scripts/profile/spec_costs.py): copy-heavy ones (the reply repeats the prompt, where n-gram drafts pay) and
free-form ones (where they mostly miss), and their chat-template token ids as the TUI renders them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgellm import LLM

CODE = """def compute_total(items, tax_rate, discount=None):
    subtotal = 0
    for item in items:
        if item.quantity <= 0:
            raise ValueError(f"bad quantity for {item.name}")
        subtotal += item.price * item.quantity
    if discount is not None:
        subtotal -= subtotal * discount
    tax = subtotal * tax_rate
    return round(subtotal + tax, 2)
"""
PARAGRAPH = (
    "The comittee met on Tuesday to discuss the budget for the coming year. After a long debate, the members "
    "agreed to increase funding for the public library and to postpone the renovation of the town hall until "
    "the spring. The chair thanked everyone for their patience and closed the meeting at nine o'clock."
)
JSON_DOC = (
    '{"id": 4127, "name": "Ada Lovelace", "email": "ada@example.org", "role": "engineer", '
    '"team": "analytics", "active": true, "projects": ["engine", "notes", "tables"], "manager": 88}'
)
COPY = [
    f"Repeat this function with the variable `subtotal` renamed to `amount`. Print only the code.\n\n{CODE}",
    f"Fix the typo in this paragraph and print the whole paragraph again:\n\n{PARAGRAPH}",
    f'Print this JSON again with the role changed to "manager":\n\n{JSON_DOC}',
]
FREE = [
    "Write a short poem about the sea at night.",
    "What are three good habits for staying healthy? Explain each briefly.",
    "Tell me a short story about a robot who learns to paint.",
]


def chat_ids(llm: LLM, text: str) -> list[int]:
    """`text` as one user message in the model's chat template (tui.prompt's rendering)."""
    from tui.messages import ChatMessage
    from tui.prompt import render_prompt_ids

    return render_prompt_ids(llm, [ChatMessage("user", text)])
