"""Grammar compilation out of process (issue 23): the schemas and grammars that crashed llguidance in the
caller's process are GrammarErrors naming the limit they pass, a worker that crashes or runs past its
deadline fails only its own compile and is replaced, and a grammar that matches nothing is refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm.grammar.compile import GrammarError, compile_grammar
from edgellm.grammar.limits import MAX_RULE_DEPTH, MAX_SCHEMA_DEPTH, check_grammar, check_schema
from edgellm.grammar.worker import GrammarPool
from edgellm.server.tools import ToolRequest
from edgellm.testing.grammar_attacks import PYDANTIC_WEATHER, REF_LOOP, SELF_REF, lark_chain, ref_chain
from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT

# Each case in a fresh interpreter: the old code died here by SIGSEGV (exit 139), taking the caller along.
IN_PROCESS_ATTACKS = """
import json, sys
from edgellm import SamplingParams
from edgellm.testing.grammar_attacks import lark_chain, ref_chain
cases = {"ref_chain_2000": dict(json_schema=ref_chain(2000)), "lark_3000": dict(grammar=lark_chain(3000)),
         "lark_20000": dict(grammar=lark_chain(20000))}
out = {}
for name, kwargs in cases.items():
    try:
        SamplingParams(**kwargs)
        out[name] = "compiled"
    except ValueError as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def test_sampling_params_refuse_the_crashing_chains_naming_the_limit() -> None:
    run = subprocess.run(
        [sys.executable, "-c", IN_PROCESS_ATTACKS], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["ref_chain_2000"].startswith("GrammarError") and "MAX_SCHEMA_DEPTH" in out["ref_chain_2000"]
    for name in ("lark_3000", "lark_20000"):
        assert out[name].startswith("GrammarError") and "MAX_RULE_DEPTH" in out[name], out


def test_the_limits_leave_room_for_real_schemas_and_grammars() -> None:
    assert compile_grammar(json_schema=ref_chain(30))  # ~90 levels through $refs
    assert compile_grammar(grammar=lark_chain(MAX_RULE_DEPTH - 2))
    recursive = 'start: expr\nexpr: expr "+" term | term\nterm: "(" expr ")" | NUMBER\nNUMBER: /[0-9]+/\n'
    check_grammar(recursive)  # recursion is not a chain
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items":
            {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"}  # fmt: skip
    check_schema(tree)
    assert compile_grammar(json_schema=tree)
    with pytest.raises(GrammarError, match=f"the limit is {MAX_SCHEMA_DEPTH}"):
        check_schema(ref_chain(60))
    with pytest.raises(GrammarError, match="'r300'"):  # names where the chain ends
        check_grammar(lark_chain(300))
    gbnf_chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(400)) + 'r400 ::= "x"\n'
    with pytest.raises(GrammarError, match="MAX_RULE_DEPTH"):
        check_grammar(gbnf_chain)


@pytest.mark.parametrize(
    ("schema", "loop"),
    [(SELF_REF, "# -> #"), (REF_LOOP, "#/$defs/a -> #/$defs/b -> #/$defs/a")],
)
def test_a_ref_loop_that_never_reaches_a_value_is_refused_naming_it(schema: dict, loop: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(f"loop {loop} never reaches a value")):
        compile_grammar(json_schema=schema)


def test_a_worker_crash_or_timeout_fails_only_that_compile(tokenizer_vocab) -> None:
    pool = GrammarPool(size=1, timeout_s=60)
    try:
        # past the limit checks (the pool is below them): the native compiler overflows its stack
        with pytest.raises(GrammarError, match="crashed the grammar compiler .*SIGSEGV"):
            pool.run(("grammar", lark_chain(3000)))
        assert pool.crashes == 1
        assert '"x"' in pool.run(("grammar", 'start: "x"'))  # a fresh worker took its place
        pid = pool._idle[0].process.pid
        limits = Path(f"/proc/{pid}/limits").read_text()
        line = next(s for s in limits.splitlines() if s.startswith("Max address space"))
        assert str(pool.memory_bytes) in line  # the worker's memory cap
        # a deadline shorter than a fresh worker's start: killed, reported, replaced
        pool.timeout_s = 0.05
        with pytest.raises(GrammarError, match="took longer than 0.05 s"):
            pool.run(("json_schema", {"type": "object"}), tokenizer_vocab)
        pool.timeout_s = 60
        assert pool.run(("json_schema", {"type": "object"}), tokenizer_vocab)
    finally:
        pool.close()


def test_with_the_vocabulary_a_grammar_that_matches_nothing_is_refused(tokenizer_vocab) -> None:
    pool = GrammarPool(size=1)
    try:
        # below the limit checks, the matcher's first mask is the backstop
        with pytest.raises(GrammarError, match="matches no output at all"):
            pool.run(("json_schema", SELF_REF), tokenizer_vocab)
        assert pool.run(("regex", "a*"), tokenizer_vocab)  # only the empty string is fine: EOS is allowed
    finally:
        pool.close()


def test_required_tools_with_defs_and_refs_compile_with_each_refs_meaning_kept() -> None:
    own_ref = {"type": "object", "properties": {"next": {"$ref": "#/properties/value"}, "value": {"type":
               "integer"}}, "definitions": {"Old": {"type": "boolean"}}}  # fmt: skip
    own_ref["properties"]["old"] = {"$ref": "#/definitions/Old"}
    tools = [{"type": "function", "function": {"name": n, "parameters": p}}
             for n, p in (("weather", PYDANTIC_WEATHER), ("other", own_ref))]  # fmt: skip
    combined = ToolRequest(tools, "required", False).json_schema()
    defs = combined["$defs"]
    assert set(defs) == {"weather", "weather.Unit", "weather.Place", "other", "other.Old"}
    assert defs["weather"]["properties"]["unit"] == {"$ref": "#/$defs/weather.Unit"}
    assert defs["other"]["properties"]["next"] == {"$ref": "#/$defs/other/properties/value"}
    assert defs["other"]["properties"]["old"] == {"$ref": "#/$defs/other.Old"}
    assert PYDANTIC_WEATHER["properties"]["unit"] == {
        "$ref": "#/$defs/Unit"
    }  # the request's own is untouched
    assert compile_grammar(json_schema=combined)


@pytest.fixture(scope="module")
def tokenizer_vocab(smollm2_path: Path):
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import tokenizer_from_gguf

    gguf = load_gguf(smollm2_path)
    return tokenizer_from_gguf(gguf), config_from_gguf(gguf).n_vocab
