"""Run llama.cpp's own server test suite (tools/server/tests of the llama.cpp vendored by llama-cpp-python
0.3.36) against `edgellm serve`, and print what passed and failed, each failure next to the known reason
when it is one of KNOWN_DIFFERENCES.

Nothing is fetched at run time: the tests are read from the sdist you downloaded once
(`pip download --no-binary :all: --no-deps -d DIR llama-cpp-python==0.3.36`). Their ServerProcess starts
`$LLAMA_SERVER_BIN_PATH` with llama-server's flags; this script points that at a shim (`--shim` mode of
this same file) that translates them to `edgellm serve`, with every model the presets name (they are
fetched from the Hugging Face hub there) mapped to SmolLM2-135M: answers whose text a test pins to the
tiny stories models differ by design. The suite's own Python needs: pip install filelock wget requests
aiohttp pytest.

    python scripts/compat/llama_server_tests.py --sdist DIR/llama_cpp_python-0.3.36.tar.gz \\
        [--tests unit/test_completion.py unit/test_tokenize.py ...] [--junit OUT.xml]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS_DIR = "vendor/llama.cpp/tools/server/tests/"
TEMPLATES_DIR = "vendor/llama.cpp/models/templates/"  # the tests' --chat-template-file ../../../models/...
# Test files of features edgellm does not have (yet): vision, LoRA, reranking, speculative decoding
# across llama-server's flags, server-side tools/MCP, the proxy, sleep, slot save/restore, GCP mode.
SKIPPED_FILES = {
    "test_vision_api.py", "test_lora.py", "test_rerank.py", "test_speculative.py", "test_tools_builtin.py",
    "test_mcp_servers.py", "test_proxy.py", "test_sleep.py", "test_slot_save.py", "test_compat_gcp.py",
    "test_router.py", "test_kv_keep_only_active.py", "test_ctx_shift.py",
}  # fmt: skip
DEFAULT_FILES = [
    "test_basic.py", "test_completion.py", "test_chat_completion.py", "test_tokenize.py", "test_infill.py",
    "test_embedding.py", "test_metrics.py", "test_security.py", "test_stream.py", "test_template.py",
    "test_ignore_eos.py", "test_compat_anthropic.py", "test_compat_oai_responses.py", "test_tool_call.py",
]  # fmt: skip
# llama-server flags -> edgellm serve's (None: the flag's value is dropped: see the shim's docstring).
VALUE_FLAGS = {
    "--port": "--port", "--host": "--host", "--temp": "--temperature", "--seed": "--seed",
    "--ctx-size": "--ctx", "-c": "--ctx", "--parallel": "--max-num-seqs", "-np": "--max-num-seqs",
    "--threads": "--threads", "--api-key": "--api-key",
    "--chat-template-file": "--chat-template-file", "--reasoning-format": "--reasoning-format",
    "--cors-origins": "--cors-origin",
    "--batch-size": None, "--ubatch-size": None, "--n-gpu-layers": None, "--n-predict": None, "-fa": None,
    "--pooling": None, "--tags": None, "-ctk": None, "-ctv": None, "--cache-ram": None,
    "--alias": None,  # edgellm's --served-model-name refuses other names (as OpenAI); the suite sends any
    "--model": None, "--hf-repo": None, "--hf-file": None, "--model-url": None,
    "--reasoning": None,  # off: --reasoning-budget 0 (the shim)
}  # fmt: skip
SWITCHES = {"--cont-batching", "--embedding", "--metrics", "--slots", "--no-slots", "--jinja", "--no-jinja",
            "--offline", "--no-ui", "--verbose", "--kv-unified", "--swa-full", "--reranking"}  # fmt: skip
# Tests whose failure here has a known reason (test id prefix -> why), from runs of every DEFAULT_FILES file.
_TINY = "its text or token counts pin stories260K's (or the hub model it names); SmolLM2-135M answers here"
_FINGERPRINT = "system_fingerprint is edgellm's, not a llama.cpp build ('b1234')"
_FIRST_CHUNK = "the first stream chunk is OpenAI's {role, content: ''}; the suite wants content null"
_TOOL_MODELS = ("the tool-call tests need the models they name (SmolLM2-135M here does not call tools "
                "reliably); streamed, " + _FIRST_CHUNK)  # fmt: skip
_CORS = ("no CORS unless --cors-origin (a page of another origin cannot call a local server by default), and "
         "llama-server's 'localhost' origin keyword has no --cors-origin form")  # fmt: skip
_HEADER_CASE = ("Process-Start-Time-Unix is sent, but HTTP header names come lowercased here (Starlette) "
                "and the suite looks it up case-sensitively")  # fmt: skip
KNOWN_DIFFERENCES = {
    "unit/test_basic.py::test_server_multiple_addresses": "--host takes one address here, not a list",
    "unit/test_basic.py::test_server_props": "each request may use the whole context (paged KV cache); "
    "llama-server reports n_ctx / n_slots per slot",
    "unit/test_basic.py::test_server_slots": "/slots is always served (no --slots/--no-slots); llama-server "
    "answers 501 without --slots",
    "unit/test_basic.py::test_load_split_model": "the split model comes from the hub (not reached here)",
    "unit/test_basic.py::test_no_ui": "no --no-ui: a browser always gets the chat page",
    "unit/test_basic.py::test_server_model_aliases_and_tags": "llama-server's comma-separated --alias list "
    "and --tags are not edgellm's (--served-model-name, repeatable)",
    "unit/test_basic.py::test_server_models": "the shim drops --alias (edgellm's --served-model-name would "
    "refuse the other names the suite sends): the model is listed by its own name",
    "unit/test_tokenize.py::test_tokenize_with_bos": "SmolLM2's tokenizer adds no BOS; stories260K's does",
    "unit/test_completion.py::test_completion[": "its content regexes and token counts are stories260K's",
    "unit/test_completion.py::test_completion_stream[": "its content regexes and counts are stories260K's",
    "unit/test_completion.py::test_completion_response_fields[I believe the meaning of life is-32":
    "the prompt's text pins stories260K's BOS ('<s> '); SmolLM2 has none",
    "unit/test_completion.py::test_completion_prompt_cache": "its token counts pin stories260K's tokenizer",
    "unit/test_completion.py::test_completion_with_openai_library": _FINGERPRINT + "; " + _TINY,
    "unit/test_completion.py::test_completion_stream_with_openai_library": _FINGERPRINT + "; " + _TINY,
    "unit/test_completion.py::test_nocache_long_input_prompt": "each request may use the whole context "
    "(512 here), where llama-server gives each of 2 slots 256",
    "unit/test_completion.py::test_n_probs_post_backend_sampling": "llama-server's --backend_sampling has "
    "no edgellm equivalent (the shim refuses it at start)",
    "unit/test_completion.py::test_n_probs_post_sampling": "post_sampling_probs (the distribution after the "
    "sampler chain) is not kept by the engine: a 400 naming it; n_probs alone is served",
    "unit/test_chat_completion.py::test_chat_completion[": _FINGERPRINT + "; " + _TINY + "; --chat-template "
    "NAME (llama.cpp's built-in templates) has no edgellm form",
    "unit/test_chat_completion.py::test_chat_completion_stream[": _FINGERPRINT + "; " + _FIRST_CHUNK
    + "; the reply names the model by its own name (the shim drops --alias)",
    "unit/test_chat_completion.py::test_chat_completion_with_openai_library": _FINGERPRINT,
    "unit/test_chat_completion.py::test_chat_completion_cached_tokens": "the prefix cache reuses whole KV "
    "pages, and " + _TINY,
    "unit/test_chat_completion.py::test_chat_template": "--chat-template NAME (llama.cpp's built-in "
    "templates) has no edgellm form, and no __verbose debug object ('verbose' is refused unless false)",
    "unit/test_chat_completion.py::test_chat_template_assistant_prefill": "a trailing assistant message is "
    "not continued (no prefill), and no __verbose debug object",
    "unit/test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat": "continue_final_"
    "message is refused unless false (no prefill), and no __verbose debug object",
    "unit/test_chat_completion.py::test_apply_chat_template": "--chat-template NAME (llama.cpp's built-in "
    "templates) has no edgellm form: edgellm takes a template file",
    "unit/test_chat_completion.py::test_invalid_chat_completion_req[messages7": "two assistant messages in "
    "a row are accepted, as OpenAI does",
    "unit/test_chat_completion.py::test_chat_completion_with_timings_per_token": "timings_per_token is "
    "refused unless false: timings come once, with the finished reply",
    "unit/test_chat_completion.py::test_context_size_exceeded": "the error is OpenAI's invalid_request_error "
    "(context_length_exceeded), not llama-server's exceed_context_size_error with per-slot n_ctx",
    "unit/test_chat_completion.py::test_return_progress": "return_progress is refused unless false: no "
    "prompt progress events",
    "unit/test_chat_completion.py::test_verbose_debug": "no __verbose debug object ('verbose' is refused "
    "unless false)",
    "unit/test_chat_completion.py::test_logprobs_stream": _FIRST_CHUNK,
    "unit/test_embedding.py::test_embedding_mixed_input[": "llama-server's inputs mixing texts, token ids "
    "and prompt objects (and an empty text) are refused: OpenAI's input forms are taken",
    "unit/test_embedding.py::test_embedding_content_text_same_as_string": "llama-server's {content: [parts]} "
    "embedding input is not taken (OpenAI's input forms are)",
    "unit/test_embedding.py::test_embedding_pooling_none": "no --pooling none (per-token embeddings)",
    "unit/test_embedding.py::test_embedding_error_prompt_too_long": "the error is OpenAI's wording ('maximum "
    "context length'), not llama-server's 'too large'",
    "unit/test_embedding.py::test_embedding_usage_": _TINY + " (BOS/EOS)",
    "unit/test_embedding.py::test_embedding_openai_library": _TINY,
    "unit/test_infill.py::test_infill_with": "SmolLM2 has no FIM tokens (a 400 saying so); " + _TINY,
    "unit/test_metrics.py::test_metrics_disabled": "/metrics is always served (no --metrics switch)",
    "unit/test_metrics.py::test_metrics_prometheus_format": _HEADER_CASE,
    "unit/test_metrics.py::test_metrics_predicted_total_matches_requests": _HEADER_CASE,
    "unit/test_metrics.py::test_metrics_embedding_prompt_is_counted": _HEADER_CASE,
    "unit/test_metrics.py::test_metrics_prompt_processed_and_cached": "the prefix cache reuses whole KV "
    "pages: the suite's 10-token prompt fills none",
    "unit/test_metrics.py::test_metrics_timings_on_prompt_progress": "timings_per_token/return_progress are "
    "refused unless false",
    "unit/test_security.py::test_correct_api_key": "/completions (no /v1) is OpenAI's completions here, as "
    "every /v1-less route (an OpenAI client whose base_url lacks /v1); llama-server serves its native "
    "/completion there",
    "unit/test_security.py::test_access_static_assets_without_api_key": "llama.cpp's web UI assets (/sw.js, "
    "/manifest.webmanifest, /_app/version.json) are not edgellm's chat page's",
    "unit/test_security.py::test_cors_": _CORS,
    "unit/test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers": "no /cors-proxy (the web "
    "UI's MCP proxy)",
    "unit/test_security.py::test_local_media_file": "no multimodal input (local media files): the shim "
    "refuses --media-path",
    "unit/test_security.py::test_correct_api_key_anthropic_header": "x-api-key is taken on the Anthropic "
    "routes only (Authorization: Bearer everywhere)",

    "unit/test_stream.py::test_stream_": "llama-server's router mode (models loaded by name per request)",
    "unit/test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion": "--chat-"
    "template NAME (llama.cpp's built-in templates) has no edgellm form",
    "unit/test_template.py::test_reasoning[": "tools: [] (its tools1 case) is a 400, as OpenAI answers",
    "unit/test_template.py::test_date_inside_prompt[": "llama.cpp gives Llama 3.x templates today's date as "
    "date_string; here they get transformers' variables (their own default date); firefunction-v2's "
    "template reads a `functions` variable only llama.cpp's firefunction handler sets; tools: [] is a 400",
    "unit/test_tool_call.py::test_calc_result": _TOOL_MODELS,
    "unit/test_tool_call.py::test_completion_with_required_tool_real_model": _TOOL_MODELS,
    "unit/test_tool_call.py::test_hello_world": _TOOL_MODELS,
    "unit/test_tool_call.py::test_weather": _TOOL_MODELS,
    "unit/test_tool_call.py::test_thoughts": _TOOL_MODELS,
    "unit/test_tool_call.py::test_completion_without_tool_call_": "streamed, " + _FIRST_CHUNK,
    "unit/test_compat_anthropic.py::test_anthropic_vision": "no multimodal input: an image is a 400 naming "
    "it (llama-server: 500), and the multimodal model comes from the hub",
    "unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image": "no multimodal input: an image "
    "is a 400 naming it (llama-server: 500)",
    "unit/test_compat_anthropic.py::test_anthropic_empty_messages": "empty messages are a 400, as Anthropic "
    "answers",
    "unit/test_compat_anthropic.py::test_anthropic_thinking_with_reasoning_model": "its reasoning model "
    "comes from the hub: SmolLM2 here writes no thinking blocks",
    "unit/test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry": "return_progress is "
    "refused unless false",
    "unit/test_compat_oai_responses.py::test_responses_with_openai_library": _TINY,
}


def shim(argv: list[str]) -> int:
    """llama-server's command line -> `edgellm serve smollm2-135m ...` (exec'd). Flags edgellm has are
    translated, those that change nothing observable here dropped (VALUE_FLAGS None, SWITCHES); any
    other flag is an error naming it, so a test that needs it fails at start instead of silently."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i]
        if flag in SWITCHES:
            i += 1
            continue
        if flag not in VALUE_FLAGS:
            print(f"edgellm shim: llama-server flag {flag} has no edgellm equivalent", file=sys.stderr)
            return 2
        if VALUE_FLAGS[flag] is not None:
            value = argv[i + 1]
            if flag == "--temp":
                value = str(min(float(value), 2.0))
            if flag == "--reasoning-format" and value == "nothink":
                value = "none"
            out += [VALUE_FLAGS[flag], value]
        elif flag == "--reasoning" and argv[i + 1] == "off":  # on/auto: the template decides, as here
            out += ["--reasoning-budget", "0"]
        i += 2
    os.execv(sys.executable, [sys.executable, "-m", "edgellm", "serve", "smollm2-135m", *out])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--shim":
        return shim(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", required=True, type=Path, help="llama_cpp_python-0.3.36.tar.gz")
    ap.add_argument("--tests", nargs="*", default=None, help="unit/test_*.py files (default: DEFAULT_FILES)")
    ap.add_argument("--junit", type=Path, default=None, help="also write the junit XML here")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a server may take to start, and a "
                    "request to answer (the suite's 60 s, too short on a busy machine)")  # fmt: skip
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llama-server-tests-"))
    with tarfile.open(args.sdist) as tar:
        members = [m for m in tar.getmembers() if TESTS_DIR in m.name or TEMPLATES_DIR in m.name]
        tar.extractall(work, members=members, filter="data")
    [tests] = {Path(m.name.split(TESTS_DIR)[0]) for m in members if TESTS_DIR in m.name}
    root = work / tests / TESTS_DIR
    utils = root / "utils.py"
    timeout = f"DEFAULT_HTTP_TIMEOUT = {args.timeout}"
    utils.write_text(utils.read_text().replace("DEFAULT_HTTP_TIMEOUT = 60", timeout))
    shim_path = work / "llama-server"
    shim_path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --shim \"$@\"\n")
    shim_path.chmod(0o755)
    files = args.tests or [f"unit/{f}" for f in DEFAULT_FILES]
    files = [f for f in files if Path(f).name not in SKIPPED_FILES]
    junit = args.junit or work / "junit.xml"
    repo = Path(__file__).resolve().parents[2]  # this checkout's edgellm, whatever pip installed
    # A free port, not the suite's 8080: a server left on 8080 (another run's) would answer every test.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(shim_path), "PYTHONPATH": f"{root}{os.pathsep}{repo}",
           "PORT": port}  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]
    subprocess.run(cmd, cwd=root, env=env, check=False)
    return summarize(junit)


def summarize(junit: Path) -> int:
    passed, failed, skipped = [], [], []
    for case in ET.parse(junit).iter("testcase"):
        tid = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(tid)
        elif case.find("skipped") is not None:
            skipped.append(tid)
        else:
            passed.append(tid)
    unknown = []
    for tid in failed:
        prefixes = [p for p in KNOWN_DIFFERENCES if tid.startswith(p)]  # the longest (most specific) wins
        why = KNOWN_DIFFERENCES[max(prefixes, key=len)] if prefixes else None
        print(f"FAILED {tid}" + (f"  [known: {why}]" if why else ""))
        unknown += [] if why else [tid]
    print(f"{len(passed)} passed, {len(failed)} failed ({len(unknown)} without a known reason), "
          f"{len(skipped)} skipped")  # fmt: skip
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
