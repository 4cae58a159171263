"""Cheap checks on a grammar source before it is sent to be compiled: its size, how deep it nests and how
long a chain of `$ref`s or rule references it holds. llguidance recurses once per link of such a chain in
native code (a chain of about 2,000 `$ref`s through `anyOf`, or 3,000 Lark rules `r0: r1`, overflows an
8 MiB stack: a SIGSEGV, not an error), and guards only bracket and JSON nesting itself. The limits are far
past what a real schema or grammar uses and well inside what compiles on the compile worker's stack, so
anything past them is refused here with a GrammarError naming the limit; the worker process is the
backstop for whatever else the native code cannot take. Every walk here is iterative: a hostile input
cannot make these checks recurse either.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_SOURCE_CHARS = 1 << 20  # a grammar or regex source; a JSON schema as compact JSON text
MAX_SCHEMA_DEPTH = 128  # JSON levels of a schema, counted through each `$ref` into its target
MAX_RULE_DEPTH = 256  # rules in the longest chain of Lark/GBNF rule references (recursion not counted)
MAX_NESTING = 128  # brackets open at once in a grammar or regex source

# A schema that is only a reference (annotations aside) is its target: a cycle of those never reaches a
# value ({"$ref": "#"}; a -> b -> a), and llguidance then compiles a grammar that matches nothing.
_ANNOTATIONS = {"$ref", "$defs", "definitions", "title", "description", "$comment", "$id", "$schema"}
_ANNOTATIONS |= {"default", "examples", "deprecated", "readOnly", "writeOnly"}


class GrammarError(ValueError):
    """A grammar, schema or regex that cannot be compiled; the message says what is wrong."""


def check_schema(schema: dict[str, Any]) -> None:
    """Size, depth (through `$ref`s) and `$ref` cycles that never reach a value."""
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SOURCE_CHARS:
        raise GrammarError(f"the JSON schema is {size} characters; the limit is {MAX_SOURCE_CHARS}")
    _check_ref_loops(schema)
    depth = _schema_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarError(
            f"the JSON schema nests {depth} levels deep counting through its $refs (a $ref chain that long "
            f"crashes the compiler); the limit is {MAX_SCHEMA_DEPTH} (MAX_SCHEMA_DEPTH)"
        )


def check_source(name: str, text: Any) -> None:
    if not isinstance(text, str) or not text:
        raise GrammarError(f"{name} must be a non-empty string")
    if len(text) > MAX_SOURCE_CHARS:
        raise GrammarError(f"{name} is {len(text)} characters; the limit is {MAX_SOURCE_CHARS}")


def check_regex(regex: Any) -> None:
    check_source("regex", regex)
    _check_nesting("regex", regex)


def check_grammar(grammar: Any) -> None:
    """A Lark or GBNF source: size, bracket nesting and the longest chain of rule references."""
    check_source("grammar", grammar)
    body = _strip_literals(grammar)
    _check_nesting("grammar", body)
    rules: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body.splitlines():
        m = _RULE_HEAD.match(line)
        if m:
            current = rules.setdefault(m.group(1), [])
            line = line[m.end() :]
        if current is not None:
            current.extend(_NAME.findall(line))
    depth, chain_end = _longest_chain({r: [n for n in refs if n in rules] for r, refs in rules.items()})
    if depth > MAX_RULE_DEPTH:
        raise GrammarError(
            f"the grammar has a chain of {depth} rules each referring to the next (ending at {chain_end!r}; "
            f"a chain that long crashes the compiler); the limit is {MAX_RULE_DEPTH} (MAX_RULE_DEPTH)"
        )


# `name:` (Lark, with optional `.priority` and `?`/`!` modifiers) or `name ::=` (GBNF) starting a line.
_RULE_HEAD = re.compile(r"^\s*[?!]?([A-Za-z_][\w-]*)(?:\.-?\d+)?\s*(?::(?!:)|::=)")
_NAME = re.compile(r"[A-Za-z_][\w-]*")
# Comments (// and #), string literals and Lark's /regex/ literals: no rule names or brackets in those.
_LITERALS = re.compile(
    r"//[^\n]*|#[^\n]*|" r'"(?:\\.|[^"\\\n])*"|' r"'(?:\\.|[^'\\\n])*'|/(?:\\.|[^/\\\n])+/[imslux]*"
)


def _strip_literals(text: str) -> str:
    return _LITERALS.sub(" ", text)


def _check_nesting(name: str, text: str) -> None:
    depth = deepest = 0
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(depth - 1, 0)
    if deepest > MAX_NESTING:
        raise GrammarError(
            f"the {name} nests {deepest} brackets deep; the limit is {MAX_NESTING} (MAX_NESTING)"
        )


def _longest_chain(graph: dict[str, list[str]]) -> tuple[int, str | None]:
    """The number of nodes on the longest reference chain (a reference back into the chain being walked
    is recursion and ends it), and the node it ends at. Memoised, iterative depth-first walk."""
    depth: dict[str, int] = {}
    end: dict[str, str] = {}
    on_path: set[str] = set()
    for root in graph:
        if root in depth:
            continue
        stack = [(root, iter(graph[root]))]
        on_path.add(root)
        depth[root], end[root] = 1, root
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(node)
                if stack:
                    parent = stack[-1][0]
                    if depth[node] + 1 > depth[parent]:
                        depth[parent], end[parent] = depth[node] + 1, end[node]
                continue
            if child in on_path:
                continue
            if child in depth:
                if depth[child] + 1 > depth[node]:
                    depth[node], end[node] = depth[child] + 1, end[child]
                continue
            depth[child], end[child] = 1, child
            on_path.add(child)
            stack.append((child, iter(graph[child])))
    if not depth:
        return 0, None
    worst = max(depth, key=depth.__getitem__)
    return depth[worst], end[worst]


def _resolve(schema: dict[str, Any], ref: str) -> Any:
    """The local JSON pointer `ref` ("#", "#/$defs/a") in `schema`, or None (remote or missing: llguidance
    reports those itself)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: Any = schema
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _schema_nodes(schema: dict[str, Any]) -> dict[int, tuple[Any, list[Any]]]:
    """Every dict/list of the schema by id -> (node, its children), a `$ref` counted as a child (its
    target)."""
    nodes: dict[int, tuple[Any, list[Any]]] = {}
    todo = [schema]
    while todo:
        node = todo.pop()
        if id(node) in nodes:
            continue
        values = list(node.values()) if isinstance(node, dict) else list(node)
        children = [v for v in values if isinstance(v, (dict, list))]
        if isinstance(node, dict) and "$ref" in node:
            target = _resolve(schema, node["$ref"])
            if isinstance(target, (dict, list)):
                children.append(target)
        nodes[id(node)] = (node, children)
        todo.extend(children)
    return nodes


def _schema_depth(schema: dict[str, Any]) -> int:
    nodes = _schema_nodes(schema)
    graph = {key: [id(c) for c in children] for key, (_, children) in nodes.items()}
    return _longest_chain(graph)[0]


def _check_ref_loops(schema: dict[str, Any]) -> None:
    """A cycle of schemas that are nothing but a `$ref` (annotations aside): no value can ever match."""
    seen_clean: set[int] = set()
    for key, (node, _) in _schema_nodes(schema).items():
        if key in seen_clean or not _only_ref(node):
            continue
        path, ids = [node["$ref"]], [key]
        target = _resolve(schema, node["$ref"])
        while _only_ref(target) and id(target) not in ids and id(target) not in seen_clean:
            ids.append(id(target))
            path.append(target["$ref"])
            target = _resolve(schema, target["$ref"])
        if isinstance(target, dict) and id(target) in ids:
            loop = " -> ".join([path[-1]] + path[ids.index(id(target)) :])
            raise GrammarError(f"the JSON schema's $ref loop {loop} never reaches a value: nothing matches")
        seen_clean.update(ids)


def _only_ref(node: Any) -> bool:
    return isinstance(node, dict) and isinstance(node.get("$ref"), str) and set(node) <= _ANNOTATIONS
