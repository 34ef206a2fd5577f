"""Every error case answers its status and OpenAI's error object, and the server answers a
normal request right after each: malformed JSON, wrong types, values out of range, unknown
model, missing messages, prompts past the context, features not supported, invalid UTF-8,
oversized bodies (413), API keys (401), unknown routes (404), wrong methods (405), a full
queue (503 + Retry-After); a client that disconnects frees its slot and its KV blocks."""
from __future__ import annotations

import http.client
import json
import time

import openai
import pytest

from conftest import TINY, assert_error

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "Hi"}]


def assert_still_serving(server, headers=None):
    status, _, body = server.post_json(COMPL, {"prompt": "Once", "max_tokens": 2,
                                               "temperature": 0}, headers)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 2


# (path, body, status, param, code)
CASES = {
    "malformed json": (COMPL, b'{"prompt": "x", ', 400, None, "invalid_json"),
    "empty body": (COMPL, b"", 400, None, "invalid_json"),
    "body not an object": (COMPL, b"[1, 2]", 400, None, None),
    "nested too deep": (COMPL, b"[" * 100000 + b"]" * 100000, 400, None, "invalid_json"),
    "invalid utf-8": (COMPL, b'{"prompt": "\xff\xfe bad"}', 400, None, "invalid_json"),
    "lone surrogate": (COMPL, b'{"prompt": "\\ud800"}', 400, None, "invalid_json"),
    # found by fuzz_request: nlohmann's parser throws out_of_range, not parse_error, here
    "number beyond a double": (COMPL, b'{"prompt": "x", "max_tokens": 1e999}', 400, None,
                               "invalid_json"),
    "chat invalid utf-8": (CHAT, b'{"messages": [{"role": "user", "content": "\xc3"}]}', 400,
                           None, "invalid_json"),
    "max_tokens type": (COMPL, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", None),
    "temperature type": (COMPL, {"prompt": "x", "temperature": "hot"}, 400, "temperature", None),
    "stream type": (COMPL, {"prompt": "x", "stream": "yes"}, 400, "stream", None),
    "stop type": (COMPL, {"prompt": "x", "stop": 5}, 400, "stop", None),
    "stop list type": (COMPL, {"prompt": "x", "stop": ["a", 1]}, 400, "stop", None),
    "stop too long": (COMPL, {"prompt": "x", "stop": "a" * 300}, 400, "stop", None),
    "too many stops": (COMPL, {"prompt": "x", "stop": ["a"] * 17}, 400, "stop", None),
    "prompt type": (COMPL, {"prompt": {"a": 1}}, 400, "prompt", None),
    "prompt ids type": (COMPL, {"prompt": [1, "a"]}, 400, "prompt", None),
    "model type": (COMPL, {"prompt": "x", "model": 3}, 400, "model", None),
    "seed type": (COMPL, {"prompt": "x", "seed": "s"}, 400, "seed", None),
    "stream_options type": (COMPL, {"prompt": "x", "stream_options": 1}, 400, "stream_options",
                            None),
    "missing prompt": (COMPL, {"max_tokens": 3}, 400, "prompt", None),
    "empty prompt list": (COMPL, {"prompt": []}, 400, "prompt", None),
    "missing messages": (CHAT, {"model": "stories260K"}, 400, "messages", None),
    "messages type": (CHAT, {"messages": "hi"}, 400, "messages", None),
    "empty messages": (CHAT, {"messages": []}, 400, "messages", None),
    "message role": (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400,
                     "messages[0].role", None),
    "message content type": (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400,
                             "messages[0].content", None),
    "image content": (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]}, 400,
                      "messages[0].content", "not_supported"),
    "temperature range": (COMPL, {"prompt": "x", "temperature": 3}, 400, "temperature", None),
    "temperature negative": (COMPL, {"prompt": "x", "temperature": -1}, 400, "temperature", None),
    "top_p range": (COMPL, {"prompt": "x", "top_p": 0}, 400, "top_p", None),
    "min_p range": (COMPL, {"prompt": "x", "min_p": 1.5}, 400, "min_p", None),
    "top_k range": (COMPL, {"prompt": "x", "top_k": -2}, 400, "top_k", None),
    "repetition_penalty range": (COMPL, {"prompt": "x", "repetition_penalty": 0}, 400,
                                 "repetition_penalty", None),
    "n zero": (COMPL, {"prompt": "x", "n": 0}, 400, "n", None),
    "n too large": (COMPL, {"prompt": "x", "n": 17}, 400, "n", None),
    "max_tokens zero": (COMPL, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    "max_tokens huge": (COMPL, {"prompt": "x", "max_tokens": 2**40}, 400, "max_tokens", None),
    "max_completion_tokens negative": (CHAT, {"messages": MSGS, "max_completion_tokens": -1},
                                       400, "max_completion_tokens", None),
    "logprobs range": (COMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs", None),
    "logprobs negative": (COMPL, {"prompt": "x", "logprobs": -1}, 400, "logprobs", None),
    "logprobs type": (COMPL, {"prompt": "x", "logprobs": True}, 400, "logprobs", None),
    "logprobs with echo": (COMPL, {"prompt": "x", "logprobs": 1, "echo": True}, 400, "logprobs",
                           "not_supported"),
    "chat logprobs type": (CHAT, {"messages": MSGS, "logprobs": 3}, 400, "logprobs", None),
    "chat top_logprobs without logprobs": (CHAT, {"messages": MSGS, "top_logprobs": 3}, 400,
                                           "top_logprobs", None),
    "chat top_logprobs with logprobs false": (CHAT, {"messages": MSGS, "logprobs": False,
                                                     "top_logprobs": 0}, 400, "top_logprobs",
                                              None),
    "chat top_logprobs range": (CHAT, {"messages": MSGS, "logprobs": True, "top_logprobs": 21},
                                400, "top_logprobs", None),
    "chat top_logprobs negative": (CHAT, {"messages": MSGS, "logprobs": True,
                                          "top_logprobs": -1}, 400, "top_logprobs", None),
    "frequency_penalty": (COMPL, {"prompt": "x", "frequency_penalty": 0.5}, 400,
                          "frequency_penalty", "not_supported"),
    "logit_bias": (COMPL, {"prompt": "x", "logit_bias": {"5": 10}}, 400, "logit_bias",
                   "not_supported"),
    "tools": (CHAT, {"messages": MSGS, "tools": [{"type": "function",
                                                  "function": {"name": "f"}}]}, 400, "tools",
              "not_supported"),
    "json response_format": (CHAT, {"messages": MSGS,
                                    "response_format": {"type": "json_object"}}, 400,
                             "response_format", "not_supported"),
    "stop token id outside the vocabulary": (COMPL, {"prompt": "x", "stop_token_ids": [100000]},
                                             400, "stop_token_ids", None),
    "prompt token id outside the vocabulary": (COMPL, {"prompt": [1, 99999]}, 400, "prompt",
                                               None),
    "negative prompt token id": (COMPL, {"prompt": [1, -5]}, 400, "prompt", None),
    "prompt longer than the context": (COMPL, {"prompt": [1] * 600}, 400, "prompt",
                                       "context_length_exceeded"),
    "chat longer than the context": (CHAT, {"messages": [{"role": "user",
                                                          "content": "word " * 700}]}, 400,
                                     "messages", "context_length_exceeded"),
    "unknown model": (COMPL, {"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
    "tokenize without content": ("/tokenize", {}, 400, "content", None),
    "tokenize invalid utf-8": ("/tokenize", b'{"content": "\xe2\x82"}', 400, None,
                               "invalid_json"),
    "detokenize bad ids": ("/detokenize", {"tokens": [-1]}, 400, "tokens", None),
    "detokenize type": ("/detokenize", {"tokens": "abc"}, 400, "tokens", None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_case(tiny, case):
    path, body, status, param, code = CASES[case]
    got, _, data = tiny.request("POST", path, body)
    err = assert_error(got, json.loads(data), status, param, code)
    if case.startswith("prompt longer"):
        assert "maximum context length is 512 tokens, your prompt has 600" in err["message"]
    if case.startswith("logprobs range"):
        assert "'logprobs' must be in [0, 20], got 21" in err["message"]
    assert_still_serving(tiny)


def test_errors_through_the_openai_client(tiny):
    client = tiny.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="stories260K", prompt="x", temperature=5)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="stories260K", messages=[])
    assert e.value.body["param"] == "messages"
    assert_still_serving(tiny)


def test_model_aliases_are_accepted(tiny):
    for name in ["stories260K", "stories260K.gguf", str(TINY)]:
        status, _, body = tiny.post_json(COMPL, {"model": name, "prompt": "x", "max_tokens": 1})
        assert status == 200, body


def test_unknown_route_and_wrong_method(tiny):
    for method, path, status in [("GET", "/nope", 404), ("POST", "/v1/nope", 404),
                                 ("GET", "/v1/completions", 405), ("POST", "/health", 405),
                                 ("DELETE", "/v1/models", 404)]:
        got, _, data = tiny.request(method, path, b"{}" if method != "GET" else None)
        assert_error(got, json.loads(data), status)
        assert_still_serving(tiny)


def test_body_over_the_limit_is_413(start_server):
    server = start_server(["-m", str(TINY), "--max-body-size", "4096"])
    big = {"prompt": "x" * 10000, "max_tokens": 1}
    status, _, data = server.request("POST", COMPL, big)
    assert_error(status, json.loads(data), 413, code="request_too_large")
    assert_still_serving(server)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_api_key(start_server, how):
    key = "sk-test-123"
    args, env = ["-m", str(TINY)], None
    if how == "flag":
        args += ["--api-key", key]
    else:
        env = {"SPECDEC_API_KEY": key}
    server = start_server(args, env=env)
    good = {"Authorization": f"Bearer {key}"}
    for headers in [None, {"Authorization": "Bearer wrong"}, {"Authorization": key}]:
        for method, path in [("GET", "/v1/models"), ("POST", COMPL), ("GET", "/metrics"),
                             ("POST", "/tokenize")]:
            body = {"prompt": "x", "max_tokens": 1, "content": "x"} if method == "POST" else None
            status, hdrs, data = server.request(method, path, body, headers)
            assert_error(status, json.loads(data), 401, code="invalid_api_key")
            assert hdrs.get("WWW-Authenticate") == "Bearer"
    assert server.request("GET", "/health")[0] == 200  # health checks need no key
    assert server.request("GET", "/v1/models", headers=good)[0] == 200
    assert_still_serving(server, good)
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    r = server.client(api_key=key).completions.create(model="stories260K", prompt="x",
                                                      max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_queue_full_is_503_with_retry_after(start_server):
    server = start_server(["-m", str(TINY), "--max-queue", "2"])
    status, hdrs, data = server.request("POST", COMPL, {"prompt": "x", "max_tokens": 2, "n": 3})
    assert_error(status, json.loads(data), 503, code="queue_full")
    assert hdrs.get("Retry-After") == "1"
    status, _, body = server.post_json(COMPL, {"prompt": "x", "max_tokens": 2, "n": 2})
    assert status == 200 and len(body["choices"]) == 2
    assert_still_serving(server)


def wait_until_idle(server, timeout=5.0):
    """Polls /metrics until nothing runs, waits or holds a KV block; returns the metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = (m["specdec_requests_in_flight"] == 0 and m["specdec_requests_running"] == 0
                and m["specdec_requests_waiting"] == 0 and m["specdec_kv_blocks_used"] == 0)
        if idle or time.monotonic() > deadline:
            return m, idle
        time.sleep(0.02)


def open_request(server, body):
    """Sends a request and returns its connection and response, unread."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", CHAT, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    return conn


def test_full_queue_and_disconnects_free_the_slot_and_blocks(start_server):
    # The default model decodes ~50 tokens/s on 2 cores: a 300-token answer runs for seconds,
    # so the request is certainly in flight while the others arrive.
    server = start_server(["--max-queue", "1"])
    long = {"messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 300, "temperature": 0, "ignore_eos": True}

    # Streaming: read the first chunk, then a second request finds the queue full.
    conn = open_request(server, {**long, "stream": True})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    assert resp.read(16).startswith(b"data: ")
    status, hdrs, data = server.request("POST", CHAT, {"messages": MSGS, "max_tokens": 1})
    assert_error(status, json.loads(data), 503, code="queue_full")
    assert hdrs.get("Retry-After") == "1"
    before = server.metrics()
    assert before["specdec_requests_in_flight"] == 1
    t0 = time.monotonic()
    conn.close()  # the client goes away mid-stream
    m, idle = wait_until_idle(server)
    assert idle, m
    assert time.monotonic() - t0 < 3  # cancelled, not run to its end
    assert m['specdec_requests_finished_total{finish_reason="abort"}'] == 1

    # Not streaming: the client closes while waiting for the whole answer.
    conn = open_request(server, long)
    deadline = time.monotonic() + 10
    while server.metrics()["specdec_requests_running"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    conn.close()
    m, idle = wait_until_idle(server)
    assert idle, m
    assert time.monotonic() - t0 < 3
    assert m['specdec_requests_finished_total{finish_reason="abort"}'] == 2

    # The slot is free again.
    status, _, body = server.post_json(CHAT, {"messages": MSGS, "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
