"""scripts/gpu/gpu_check.sh end to end in the CUDA simulator (--sim: tiny shapes), offline: the wheel folder
it installs from holds a gguf wheel rebuilt from this machine's copy, which the steps must then import."""

from __future__ import annotations

import json

from tests import background_runs


def test_gpu_check_flow_runs_in_the_simulator() -> None:
    run = background_runs.start("test_gpu_check_flow_runs_in_the_simulator")
    returncode, output = run.wait()
    log = output[-5000:]
    assert returncode == 0, log
    tmp_path, out = run.workdir, run.workdir / "out"
    r = json.loads((out / "gpu_check.json").read_text())
    steps = ("versions", "models", "compare", "bench", "splitk", "graphs", "profile", "tests")
    assert set(r["steps"]) == set(steps), log
    assert all(s["rc"] == 0 for s in r["steps"].values()), r["steps"]
    assert r["versions"]["simulator"] is True
    assert r["versions"]["gguf_from"].startswith(str(tmp_path)), "gguf must come from the carried wheel"
    for name in ("smollm2", "gemma3"):
        assert r["models"][name]["bytes"] > 0
        c = r["compare"][name]
        assert c["greedy_equal"] and c["device_argmax_equal_host_argmax"], c
        assert c["tokens_compared"] >= 1 and c["logits_nmse_max"] < 1e-4, c
    b = r["bench"]["smollm2"]["decode_b1"]
    assert b["host_to_device_copies_per_token"] <= 1 and b["device_to_host_copies_per_token"] <= 1, b
    assert b["launches_per_token"] > 0 and r["bench"]["smollm2"]["in_flight_2"]["aggregate_tok_s"] > 0
    assert r["profile"]["smollm2"]["by_kernel"], r["profile"]
    k = r["splitk"]["smollm2"]  # the simulator splits the 34-key context in two
    assert k["same_tokens"] and k["context"] > k["split_keys"] > 0 and k["speedup"] > 0, k
    assert 0 < k["logits_nmse"] < 1e-4, k  # rounding only: within the CPU-vs-CUDA tolerance (compare)
    assert "no CUDA graphs" in r["graphs"]["smollm2"]["skipped"]  # graphs run on a GPU only
    assert r["tests"]["returncode"] == 0 and " passed" in r["tests"]["summary"], r["tests"]
