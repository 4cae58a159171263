"""A Jinja sandbox with resource limits, for chat templates (untrusted text from a downloaded GGUF).

Jinja's ImmutableSandboxedEnvironment stops a template from touching Python objects, but not from
spinning or allocating: nested loops can run for hours, ``'a' * 10**10`` asks for 10 GB and a recursive
macro ends in RecursionError. This environment bounds a render from the inside, so a render that blew
its limits stops on its own thread instead of spinning there forever:

- time: every loop iteration, function or macro call, filter call and intercepted operator checks the
  render's deadline (loops are rewritten at compile time to iterate through a checking wrapper);
- size: ``*``, ``**``, ``+``, ``%``, ``~``, the size-taking string methods and filters are checked
  before they allocate, captured blocks and macro bodies before they are joined, everything built is
  added up against a budget (a loop could keep what it builds in a captured block), and the output is
  counted as it is produced;
- depth: macro calls nest at most MAX_MACRO_DEPTH deep (a fixed count, so a runaway recursion stops at
  once on any machine rather than racing the clock to Python's own limit); RecursionError from anything
  else becomes a TemplateLimitError too.

A limit is raised as TemplateLimitError (a ValueError) naming what was exceeded.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jinja2 import nodes
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

DEFAULT_TIME_LIMIT_S = 2.0
# Rendered text and any string or list built on the way; well above the server's 4 MiB body limit.
DEFAULT_MAX_CHARS = 8 * 2**20
MAX_INT_BITS = 4096  # integers a template computes (** and * on ints)
# Everything a render builds, added up (a loop can keep what it builds in a captured block): a multiple
# of the per-string limit, far above what joining even a body-limit-sized conversation needs.
BUILD_BUDGET_FACTOR = 8
# Real templates nest macros a few levels (a tool schema's properties a few more); a recursion that never
# ends would otherwise run until Python's recursion limit, which a slow machine reaches after the deadline.
MAX_MACRO_DEPTH = 100

_BOUNDED_ITER = "__edgellm_bounded_iter"
_BOUNDED_CONCAT = "__edgellm_bounded_concat"
_DIGITS = re.compile(r"\d+")
# str methods and filters whose integer arguments size their result.
_SIZING_STR_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}


class TemplateLimitError(ValueError):
    """A render exceeded its time, size or recursion limit."""


class _Limits(threading.local):
    deadline: float | None = None
    time_limit: float = DEFAULT_TIME_LIMIT_S
    max_chars: int = DEFAULT_MAX_CHARS
    built: int = 0  # characters (or list items) built so far by this render
    macro_depth: int = 0  # macro calls now running, nested


_limits = _Limits()


def _check_time() -> None:
    deadline = _limits.deadline
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimitError(f"the chat template ran longer than its {_limits.time_limit:g} s limit")


def _too_large(what: str) -> TemplateLimitError:
    return TemplateLimitError(f"the chat template built {what} over its {_limits.max_chars} character limit")


def _check_len(n: int, what: str = "a string or list") -> None:
    if n > _limits.max_chars:
        raise _too_large(what)


def _count(result: Any) -> Any:
    size = _sized(result)
    if size:
        _limits.built += size
        if _limits.built > BUILD_BUDGET_FACTOR * _limits.max_chars:
            raise TemplateLimitError(
                f"the chat template built over {BUILD_BUDGET_FACTOR * _limits.max_chars} characters in all"
            )
    return result


def _bounded_join(parts: Iterable[Any]) -> str:
    """Environment.concat: joins captured blocks, macro and caller bodies once their size is known."""
    _check_time()
    if not isinstance(parts, list):
        parts = list(_bounded_iter(parts))
    _check_len(sum(len(p) for p in parts), "a captured block or macro output")
    return _count("".join(parts))


def _check_int_args(args: Iterable[Any], what: str) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > _limits.max_chars:
            raise TemplateLimitError(f"{what}: argument {a} is over the chat template's size limit")


def _check_format_string(fmt: str, what: str) -> None:
    """Widths and precisions written into a format string size its result."""
    for m in _DIGITS.finditer(fmt):
        if len(m.group()) > 12 or int(m.group()) > _limits.max_chars:
            raise TemplateLimitError(f"{what}: a field width is over the chat template's size limit")


def _sized(v: Any) -> int | None:
    return len(v) if isinstance(v, str | list | tuple) else None


def _bounded_iter(iterable: Any) -> Iterator[Any]:
    # A template's loop: the deadline is checked on every item, so even an empty body stops in time.
    for item in iterable:
        _check_time()
        yield item


def _bounded_concat(*parts: Any) -> str:
    _check_time()
    out = "".join(str(p) for p in parts)
    _check_len(len(out), "a string with '~'")
    return _count(out)


def _check_binop(op: str, left: Any, right: Any) -> None:
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            size = _sized(seq)
            if size is not None and isinstance(n, int) and size * max(n, 0) > _limits.max_chars:
                raise _too_large("a repeated string or list ('*')")
        if isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"the chat template computed an integer over {MAX_INT_BITS} bits")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            if max(abs(left).bit_length() - 1, 1) * right > MAX_INT_BITS:
                raise TemplateLimitError(f"the chat template computed an integer over {MAX_INT_BITS} bits")
    elif op == "+":
        a, b = _sized(left), _sized(right)
        if a is not None and b is not None:
            _check_len(a + b, "a string or list with '+'")
    elif op == "%" and isinstance(left, str):
        _check_format_string(left, "'%' formatting")


def _limited_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0  # a context goes first

    def filter_(*args: Any, **kwargs: Any) -> Any:
        _check_time()
        value, rest = (args[skip], args[skip + 1 :]) if len(args) > skip else (None, ())
        _check_int_args([*rest, *kwargs.values()], f"filter '{name}'")
        if isinstance(value, str):
            if name == "format":
                _check_format_string(value, "filter 'format'")
            elif name == "indent":
                width = rest[0] if rest else kwargs.get("width", 4)
                width = len(width) if isinstance(width, str) else int(width)
                _check_len(len(value) + width * (value.count("\n") + 1), "an indented string")
            elif name == "replace" and len(rest) >= 2:
                _check_len(len(value) + (len(value) + 1) * len(str(rest[1])), "a replaced string")
        return _count(fn(*args, **kwargs))

    filter_.__dict__.update(getattr(fn, "__dict__", {}))  # keeps Jinja's pass_context/pass_eval_context mark
    return filter_


class _LoopBounding(NodeTransformer):
    """Rewrites every `for` loop's iterable and every `~` concatenation into calls of the checking helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:  # noqa: N802 - Jinja's visitor naming
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_BOUNDED_ITER, "load"), [node.iter], [], None, None)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:  # noqa: N802
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_BOUNDED_CONCAT, "load"), list(node.nodes), [], None, None)


class LimitedSandboxEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals[_BOUNDED_ITER] = _bounded_iter
        self.globals[_BOUNDED_CONCAT] = _bounded_concat
        self.concat = _bounded_join  # type: ignore[method-assign]

    def finalize_filters(self) -> None:
        """Wrap every filter registered so far with the limit checks (call after adding custom ones)."""
        self.filters = {name: _limited_filter(name, fn) for name, fn in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        return _LoopBounding().visit(tree)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_time()
        _check_binop(operator, left, right)
        return _count(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_time()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", "") in _SIZING_STR_METHODS:
            _check_int_args([*args, *kwargs.values()], f"str.{__obj.__name__}")
        elif isinstance(owner, str) and getattr(__obj, "__name__", "") == "replace" and len(args) >= 2:
            _check_len(len(owner) + (len(owner) + 1) * len(str(args[1])), "a replaced string")
        if not isinstance(__obj, Macro):
            return _count(super().call(__context, __obj, *args, **kwargs))
        if _limits.macro_depth >= MAX_MACRO_DEPTH:
            raise TemplateLimitError(
                f"the chat template recursed too deeply (macro calls nested over {MAX_MACRO_DEPTH} deep)"
            )
        _limits.macro_depth += 1
        try:
            return super().call(__context, __obj, *args, **kwargs)  # a macro's body counted itself
        finally:
            _limits.macro_depth -= 1

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_format_string(value.__self__, "str.format")
        return wrapped


def render_limited(
    template: Any,
    variables: dict[str, Any],
    time_limit: float = DEFAULT_TIME_LIMIT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str:
    """Render a template compiled by LimitedSandboxEnvironment within the limits, on this thread."""
    saved = (_limits.deadline, _limits.time_limit, _limits.max_chars, _limits.built, _limits.macro_depth)
    _limits.deadline = time.monotonic() + time_limit
    _limits.time_limit, _limits.max_chars, _limits.built, _limits.macro_depth = time_limit, max_chars, 0, 0
    try:
        chunks, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > max_chars:
                raise TemplateLimitError(
                    f"the chat template's output is over its {max_chars} character limit"
                )
            chunks.append(chunk)
            _check_time()
        return "".join(chunks)
    except RecursionError:
        raise TemplateLimitError("the chat template recursed too deeply") from None
    except MemoryError:
        raise TemplateLimitError("the chat template ran out of memory") from None
    finally:
        _limits.deadline, _limits.time_limit, _limits.max_chars, _limits.built, _limits.macro_depth = saved
