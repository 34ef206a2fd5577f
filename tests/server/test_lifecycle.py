"""Start-up and shut-down: /health is 503 until the model is loaded, a taken port fails fast,
SIGTERM / SIGINT stop the server with exit status 0, finishing (or cancelling) what is in
flight: a stream in progress ends with its last chunk and [DONE]."""
from __future__ import annotations

import http.client
import json
import signal
import subprocess
import time

import pytest

from conftest import BINARY, TINY, Server


def test_health_is_503_until_loaded_then_200(start_server):
    # The default model takes a moment to load (mapping, touching its pages, the 256 MiB KV
    # pool: 20-80 polls answer 503); /health is polled from the moment the port is bound. Every
    # 503 must be the "loading" error object (checked by wait_healthy).
    server = start_server([], wait=False)
    server.wait_healthy()
    assert server.health_statuses[-1] == 200
    assert 503 in server.health_statuses
    assert set(server.health_statuses) <= {200, 503}
    assert server.health_statuses == sorted(server.health_statuses, reverse=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_zero(start_server, sig):
    server = start_server(["-m", str(TINY)])
    r = server.client().completions.create(model="stories260K", prompt="Once", max_tokens=4)
    assert r.usage.completion_tokens == 4
    t0 = time.monotonic()
    assert server.stop(sig, timeout=20) == 0
    assert time.monotonic() - t0 < 15
    assert "shutting down" in server.log_text() and "stopped" in server.log_text()


def test_sigterm_finishes_a_stream_in_flight(start_server):
    server = start_server(["--shutdown-timeout", "1"])  # the default model: ~50 tokens/s
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({
        "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 400,
        "ignore_eos": True, "temperature": 0, "stream": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    rest = resp.read().decode()  # the stream ends: cancelled after the 1 s grace
    events = [line[6:] for line in rest.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] in ("abort", "length")
    conn.close()
    assert server.proc.wait(timeout=20) == 0
    assert time.monotonic() - t0 < 15


def test_taken_port_fails_fast(start_server, tmp_path):
    server = start_server(["-m", str(TINY)])
    out = subprocess.run([str(BINARY), "serve", "-m", str(TINY), "--port", str(server.port)],
                         capture_output=True, timeout=30)
    assert out.returncode == 1
    assert b"cannot listen on 127.0.0.1" in out.stderr


def test_bad_options_fail_before_binding(tmp_path):
    for args in (["--chat-template", str(tmp_path / "missing.jinja")],
                 ["--spec", "draft"], ["-m", str(tmp_path / "missing.gguf")]):
        out = subprocess.run([str(BINARY), "serve", "--port", "0", *args],
                             capture_output=True, timeout=30)
        assert out.returncode == 1, out.stderr
        assert b"error:" in out.stderr


def test_chat_template_file(start_server, tmp_path):
    # A Jinja template of a known format, given as a file, on a model without one.
    template = tmp_path / "chatml.jinja"
    template.write_text("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'"
                        " + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")
    server = start_server(["-m", str(TINY), "--chat-template", str(template)])
    r = server.client().chat.completions.create(
        model="stories260K", max_tokens=3, temperature=0,
        messages=[{"role": "user", "content": "Hi"}])
    assert r.usage.completion_tokens == 3
    named = start_server(["-m", str(TINY), "--chat-template", "llama2"])
    r2 = named.client().chat.completions.create(
        model="stories260K", max_tokens=3, temperature=0,
        messages=[{"role": "user", "content": "Hi"}])
    assert r2.usage.prompt_tokens != r.usage.prompt_tokens  # a different format
    # Llama 2's template refuses roles that do not alternate: a 400, not a crash.
    status, _, body = named.post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    assert status == 400 and body["error"]["param"] == "messages"


def test_served_model_name(start_server):
    server = start_server(["-m", str(TINY), "--served-model-name", "my-model"])
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["my-model"]
    r = client.completions.create(model="my-model", prompt="Once", max_tokens=2)
    assert r.model == "my-model" and r.usage.completion_tokens == 2
