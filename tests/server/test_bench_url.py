"""`specdec bench --url`: the load generator against a live server - its JSON figures, Poisson
arrivals, prompts files, the API key, and clear errors for bad options and unreachable servers."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import BINARY, TINY

BENCH_TIMEOUT_S = 300


def bench(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BINARY), "bench", *args], capture_output=True, text=True,
                          timeout=BENCH_TIMEOUT_S)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def bench_json(args: list[str]) -> dict:
    return json.loads(bench([*args, "--output-format", "json"]).stdout)


def assert_percentiles(figure: dict):
    assert 0 <= figure["p50"] <= figure["p90"] <= figure["p99"], figure
    assert figure["mean"] >= 0


def test_synthetic_requests_all_complete_with_consistent_figures(tiny):
    j = bench_json(["--url", tiny.base_url, "-m", str(TINY), "--num-requests", "12",
                    "--concurrency", "4", "--input-mean", "24", "--input-stdev", "4",
                    "--output-mean", "16", "--output-stdev", "0", "--seed", "7"])
    assert j["bench"] == "url"
    assert j["endpoint"] == "/v1/completions"
    assert j["num_requests"] == 12 and j["concurrency"] == 4
    assert j["request_rate"] == "inf"
    assert j["errors"] == 0, j["error_messages"]
    assert j["completed"] == 12
    # Synthetic requests ignore EOS: each generates exactly its output length.
    assert j["output_tokens"] == 12 * 16
    assert j["input_tokens"] > 0
    assert j["wall_s"] > 0
    assert j["throughput_tok_s"] == pytest.approx(j["output_tokens"] / j["wall_s"], rel=0.05)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert_percentiles(j[key])
    # A request's first token comes before its end.
    assert j["ttft_ms"]["p50"] <= j["e2e_ms"]["p50"]


def test_poisson_arrivals_spread_the_requests_in_time(tiny):
    # 8 requests at 4 per second: the last arrives ~2 s after the first on average; with the
    # fixed seed the draws are the same every run, so the wall time is at least their span.
    args = ["--url", tiny.base_url, "-m", str(TINY), "--num-requests", "8", "--concurrency", "8",
            "--input-mean", "16", "--input-stdev", "0", "--output-mean", "4", "--output-stdev",
            "0", "--request-rate", "4", "--seed", "3"]
    j = bench_json(args)
    assert j["request_rate"] == 4
    assert j["completed"] == 8 and j["errors"] == 0
    assert j["wall_s"] > 0.5
    at_once = bench_json([a if a != "4" else "inf" for a in args])
    assert at_once["completed"] == 8
    assert at_once["wall_s"] < j["wall_s"]


def test_prompts_file_sends_text(tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in
                                 ["Once upon a time", "The little dog", "Lily went to"]) + "\n")
    j = bench_json(["--url", tiny.base_url, "--prompts", str(prompts), "-n", "8",
                    "--concurrency", "2"])
    assert j["completed"] == 3 and j["errors"] == 0
    assert 0 < j["output_tokens"] <= 3 * 8


def test_api_key_is_sent_and_a_missing_one_is_reported(start_server):
    server = start_server(["-m", str(TINY), "--api-key", "sesame"])
    args = ["--url", server.base_url, "-m", str(TINY), "--num-requests", "2", "--concurrency",
            "2", "--input-mean", "8", "--input-stdev", "0", "--output-mean", "4",
            "--output-stdev", "0"]
    ok = bench_json([*args, "--api-key", "sesame"])
    assert ok["completed"] == 2 and ok["errors"] == 0
    refused = bench(args, check=False)
    assert refused.returncode != 0
    assert "401" in refused.stderr + refused.stdout or "key" in (refused.stderr + refused.stdout).lower()
    server.stop()


@pytest.mark.parametrize("option,value", [("--request-rate", "fast"), ("--request-rate", "-1"),
                                          ("--url", "ftp://127.0.0.1:1"), ("--timeout", "0")])
def test_bad_options_are_clear_errors(tiny, option, value):
    args = ["--url", tiny.base_url, "-m", str(TINY), "--num-requests", "1"]
    if option == "--url":
        args[1] = value
    else:
        args += [option, value]
    proc = bench(args, check=False)
    assert proc.returncode != 0
    assert option.lstrip("-").split("-")[0] in proc.stderr.lower(), proc.stderr


def test_unreachable_server_is_a_clear_error():
    t0 = time.monotonic()
    # Port 9 on loopback: nothing listens there in the test environment.
    proc = bench(["--url", "http://127.0.0.1:9", "-m", str(TINY), "--num-requests", "1"],
                 check=False)
    assert proc.returncode != 0
    assert "127.0.0.1:9" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60
