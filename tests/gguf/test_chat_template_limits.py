"""Hostile chat templates (a template is untrusted text from a downloaded GGUF): each limit stops the render
with a ChatTemplateError naming it, on the rendering thread itself, and ordinary templates are untouched."""

from __future__ import annotations

import threading

import pytest

from edgellm.chat.sandbox import MAX_MACRO_DEPTH
from edgellm.chat.template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate, ChatTemplateError

MSGS = [{"role": "user", "content": "hi"}]
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
DOUBLE = "{% set ns = namespace(x=START) %}{% for i in range(64) %}{% set ns.x = ns.x OP ns.x %}{% endfor %}"

HOSTILE = [
    # (template, substring of the error)
    (NESTED_LOOPS, "ran longer than its 0.2 s limit"),
    ("{% for c in 'a' * 100000 %}{% for d in 'b' * 100000 %}{% endfor %}{% endfor %}", "ran longer"),
    ("{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(60) }}", "longer"),
    ("{{ 'a' * 10**10 }}", "repeated string or list"),
    ("{{ [0] * 10**10 }}", "repeated string or list"),
    ("{{ 2 ** 10000000 }}", "integer over 4096 bits"),
    (DOUBLE.replace("START", "3").replace("OP", "*"), "integer over 4096 bits"),
    (DOUBLE.replace("START", "'a'").replace("OP", "+"), "string or list with '+'"),
    (DOUBLE.replace("START", "'a'").replace("OP", "~"), "string with '~'"),
    ("{{ 'a' | center(10**10) }}", "filter 'center'"),
    ("{{ [1] | batch(10**10, 'x') | list }}", "filter 'batch'"),
    ("{{ ('a\n' * 1000000) | indent(1000) }}", "indented string"),
    ("{{ ('a' * 1000000) | replace('a', 'b' * 1000) }}", "replaced string"),
    ("{{ 'a'.ljust(10**10) }}", "str.ljust"),
    ("{{ '{:>9999999999}'.format(1) }}", "str.format"),
    ("{{ '%9999999999d' % 1 }}", "'%' formatting"),
    ("{{ '%s' | format('x') }}{{ '%9999999999s' | format('x') }}", "filter 'format'"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "output is over"),
    ("{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}", "recursed too deeply"),
    ("{% set x %}{% for i in range(100000) %}{{ 'x' * 8000000 }}{% endfor %}{% endset %}", "in all"),
    ("{% set x %}{% for i in range(9000) %}{{ 'z' * 1000 }}{% endfor %}{% endset %}", "captured block"),
    ("{% macro m() %}{% for i in range(9000) %}{{ 'y' * 1000 }}{% endfor %}{% endmacro %}{{ m() }}", "macro"),
]


@pytest.mark.parametrize("src,message", HOSTILE)
def test_hostile_templates_stop_at_a_named_limit(src: str, message: str) -> None:
    # Only the cases about time get the short deadline: a size or depth limit must be what stops the
    # others, however slow the machine, so they must not race a clock.
    time_limit = 0.2 if "longer" in message else 600
    with pytest.raises(ChatTemplateError, match="chat template") as exc:
        ChatTemplate(src, time_limit=time_limit).render(MSGS)
    assert message in str(exc.value)


def test_recursion_stops_at_a_fixed_depth_not_at_the_clock() -> None:
    # A generous deadline: the depth limit, not the time limit, stops a recursion that never ends (a slow
    # machine used to reach the deadline before Python's own recursion limit), and the depth is exact.
    forever = "{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}"
    with pytest.raises(ChatTemplateError, match=f"nested over {MAX_MACRO_DEPTH} deep"):
        ChatTemplate(forever, time_limit=600).render(MSGS)
    countdown = "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{% else %}bottom{% endif %}{% endmacro %}{{ m(N) }}"
    deepest = ChatTemplate(countdown.replace("N", str(MAX_MACRO_DEPTH - 1)), time_limit=600)
    assert deepest.render(MSGS) == "bottom"
    with pytest.raises(ChatTemplateError, match="recursed too deeply"):
        ChatTemplate(countdown.replace("N", str(MAX_MACRO_DEPTH)), time_limit=600).render(MSGS)
    assert deepest.render(MSGS) == "bottom"  # the depth count went back to zero after the failed render


def test_a_timed_out_render_stops_its_thread() -> None:
    # The deadline is enforced inside the render: the thread that ran it is free again, not spinning.
    errors: list[BaseException] = []

    def run() -> None:
        try:
            ChatTemplate(NESTED_LOOPS, time_limit=0.2).render(MSGS)
        except ChatTemplateError as e:
            errors.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)  # a hang guard, not a speed figure: the nested loops alone run for hours
    assert not worker.is_alive() and len(errors) == 1


def test_limits_leave_ordinary_templates_alone() -> None:
    long_text = "word " * 800_000  # a conversation as large as the server's 4 MiB body limit renders
    msgs = [{"role": "user", "content": long_text}, {"role": "assistant", "content": "ok"}]
    assert long_text in ChatTemplate(CHATML_TEMPLATE).render(msgs)
    loops = "{% for m in messages %}{% for i in range(3) %}{{ loop.index ~ m['role'] * 2 }}{% endfor %}"
    loops += "{% endfor %}"
    assert ChatTemplate(loops).render(MSGS) == "1useruser2useruser3useruser"
    small = ChatTemplate("{{ '%5s|' % 'ab' }}{{ 'x'|center(5) }}{{ 2 ** 10 }}")
    assert small.render(MSGS) == "   ab|  x  1024"
    assert ChatTemplate(GEMMA_TEMPLATE, bos_token="<bos>").render(MSGS).startswith("<bos><start_of_turn>user")


def test_check_reports_a_broken_template_at_load() -> None:
    metadata = {"tokenizer.chat_template": NESTED_LOOPS, "tokenizer.ggml.tokens": ["<s>"]}
    tmpl = ChatTemplate.from_metadata(metadata)
    tmpl.time_limit = 0.2
    with pytest.raises(ChatTemplateError, match="the gguf chat template is broken: .*ran longer"):
        tmpl.check()
    ChatTemplate.from_metadata({"tokenizer.chat_template": CHATML_TEMPLATE}).check()
    # a template that only refuses this probe conversation (its own raise_exception) is not broken
    picky = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('needs a system turn') }}{% endif %}"
    ChatTemplate(picky).check()
    with pytest.raises(ChatTemplateError, match="cannot compile"):
        ChatTemplate.from_metadata({"tokenizer.chat_template": "{% for %}"})
