"""A bounded load test: 64 concurrent clients send 320 greedy requests (half streamed, one in ten
disconnecting mid-stream, some of those before the first token) to a server speculating with
n-grams, and again with a draft model. Afterwards nothing runs and every KV block is free,
every generation finished, no request failed, and every completed response equals its solo
output (which equals `specdec generate`'s)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import SANITIZER, TINY, TINY_DRAFT, generate
from test_errors import wait_until_idle

CLIENTS = 64
REQUESTS = 320
PROMPTS = [
    "Once upon a time",
    "The little dog",
    "Lily and Ben went to the park. Lily and Ben",
    "One day, a boy named Tim",
    "The sun was shining and the birds",
    "Mom said: \"Do not touch the hot stove\". Tim",
    "There was a big tree in the garden",
    "The cat and the dog were friends. The cat and the dog",
]
MAX_TOKENS = [24, 40, 64]


def variant(i):
    """Request i's prompt, max_tokens and stop strings."""
    stop = (".",) if i % 3 == 0 else None
    return PROMPTS[i % len(PROMPTS)], MAX_TOKENS[i % len(MAX_TOKENS)], stop


SPEC_ARGS = {"ngram": ["--spec", "ngram"],
             "draft": ["--spec", "draft", "--draft-model", str(TINY_DRAFT)]}


@pytest.mark.parametrize("method", sorted(SPEC_ARGS))
def test_concurrent_clients_mixed_streaming_with_disconnects(start_server, method):
    server = start_server(["-m", str(TINY), *SPEC_ARGS[method]])
    client = server.client(timeout=60)
    kinds = len(PROMPTS) * len(MAX_TOKENS) * 3  # the variants repeat with this period

    # Solo outputs, one request at a time.
    solo = {}
    for i in range(kinds):
        key = variant(i)
        if key in solo:
            continue
        prompt, max_tokens, stop = key
        r = client.completions.create(model="stories260K", prompt=prompt, max_tokens=max_tokens,
                                      temperature=0, stop=list(stop) if stop else None)
        solo[key] = r.choices[0].text
    solo_requests = len(solo)
    for prompt in PROMPTS[:2]:  # the solo output is the CLI's
        assert solo[(prompt, 64, None)] == generate(["-m", str(TINY), "-p", prompt, "-n",
                                                      "64"])["text"]

    def run(i):
        prompt, max_tokens, stop = variant(i)
        args = dict(model="stories260K", prompt=prompt, max_tokens=max_tokens, temperature=0,
                    stop=list(stop) if stop else None)
        try:
            if i % 10 == 9:  # disconnect mid-stream (every other one before any token)
                stream = client.completions.create(
                    stream=True, **{**args, "max_tokens": 400, "stop": None},
                    extra_body={"ignore_eos": True})
                if i % 20 != 19:
                    for n, _ in enumerate(stream):
                        if n == 2:
                            break
                stream.close()
                return ("disconnected", None, None)
            if i % 2 == 0:
                text, finish = "", None
                for chunk in client.completions.create(stream=True, **args):
                    for c in chunk.choices:
                        text += c.text
                        finish = c.finish_reason or finish
                return ("ok", (prompt, max_tokens, stop), (text, finish))
            r = client.completions.create(**args)
            return ("ok", (prompt, max_tokens, stop), (r.choices[0].text,
                                                       r.choices[0].finish_reason))
        except Exception as e:  # noqa: BLE001 - every failure is reported below
            return ("error", (prompt, max_tokens, stop), repr(e))

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        results = list(pool.map(run, range(REQUESTS)))
    elapsed = time.monotonic() - t0

    errors = [r for r in results if r[0] == "error"]
    assert not errors, errors[:5]
    mismatched = [(key, got) for status, key, got in results
                  if status == "ok" and got[0] != solo[key]]
    assert not mismatched, mismatched[:3]
    assert all(got[1] in ("stop", "length") for status, _, got in results if status == "ok")
    assert sum(1 for r in results if r[0] == "disconnected") == REQUESTS // 10

    m, idle = wait_until_idle(server, timeout=10)
    assert idle, {k: v for k, v in m.items() if "requests" in k or "kv_blocks" in k}
    finished = sum(v for k, v in m.items() if k.startswith("specdec_requests_finished_total"))
    assert finished == REQUESTS + solo_requests
    assert m['specdec_requests_finished_total{finish_reason="error"}'] == 0
    # The disconnected streams (400 tokens asked, ignore_eos) were cancelled, not run out.
    aborted = m['specdec_requests_finished_total{finish_reason="abort"}']
    assert aborted >= REQUESTS // 20
    print(f"load: {REQUESTS} requests from {CLIENTS} clients in {elapsed:.1f} s, "
          f"{aborted:.0f} cancelled by disconnects")
    assert m["specdec_kv_blocks_used"] == 0
    assert m[f'specdec_spec_decode_num_draft_tokens_total{{method="{method}"}}'] > 0
    if not SANITIZER:  # a sanitized server is 5-15x slower: then only the outcome counts
        assert elapsed < 60, f"the load took {elapsed:.1f} s"
