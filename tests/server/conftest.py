"""Fixtures for the `specdec serve` tests: live servers on free loopback ports.

Every server is `build/specdec serve --port 0` (the server picks a free port and prints it), its
log in pytest's temporary directory; the tests talk to 127.0.0.1 only, to servers they started,
with bounded request counts and timeouts.

Environment: SPECDEC_BUILD_DIR (default build/), SPECDEC_SHARED_DIR (default ../shared: the tiny
models), SPECDEC_CACHE (default ~/.cache/specdec: the default model, SmolLM2, which has a chat
template; the tiny model has none).
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SPECDEC_BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "specdec"
SHARED = Path(os.environ.get("SPECDEC_SHARED_DIR", ROOT.parent / "shared"))
TINY = SHARED / "models" / "tiny" / "stories260K.gguf"
TINY_DRAFT = SHARED / "models" / "tiny" / "tinystories280K.gguf"
CACHE = Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))
DEFAULT_MODEL = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"

START_TIMEOUT_S = 60


class Server:
    """A `specdec serve` process on 127.0.0.1 and a port it chose."""

    def __init__(self, args: list[str], log_path: Path, env: dict | None = None):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "wb")
        cmd = [str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0", "-t", "2", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.port = self._wait_for_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.health_statuses: list[int] = []

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log_text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log_text()}")
            time.sleep(0.005)
        raise RuntimeError(f"server did not start:\n{self.log_text()}")

    def wait_healthy(self) -> "Server":
        """Polls /health until 200; records every status seen (503 while loading)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log_text()}")
            try:
                status, _, body = self.request("GET", "/health", timeout=5)
            except OSError:
                time.sleep(0.01)
                continue
            self.health_statuses.append(status)
            if status == 200:
                return self
            assert status == 503, body
            assert json.loads(body)["error"]["code"] == "loading"
            time.sleep(0.005)
        raise RuntimeError(f"server not healthy in time:\n{self.log_text()}")

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float = 30):
        """One HTTP request on a fresh connection: (status, headers, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def post_json(self, path: str, body, headers: dict | None = None):
        status, hdrs, data = self.request("POST", path, body, headers)
        return status, hdrs, json.loads(data)

    def metrics(self, headers: dict | None = None) -> dict[str, float]:
        """The unlabelled samples of /metrics, plus labelled ones under their full name."""
        status, _, body = self.request("GET", "/metrics", headers=headers)
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def client(self, api_key: str = "none", timeout: float = 60) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key, max_retries=0,
                             timeout=timeout)

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self.log.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session", autouse=True)
def _binary_present():
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: build it first (scripts/setup.sh)")
    if not TINY.exists():
        pytest.fail(f"{TINY} is missing (SPECDEC_SHARED_DIR)")


@pytest.fixture(scope="session")
def start_server(tmp_path_factory):
    """Factory: start_server(args) -> a healthy Server, stopped at the end of the session."""
    servers = []

    def start(args: list[str], env: dict | None = None, wait: bool = True) -> Server:
        log = tmp_path_factory.mktemp("serve") / "server.log"
        s = Server(args, log, env)
        servers.append(s)
        return s.wait_healthy() if wait else s

    yield start
    for s in servers:
        try:
            s.stop(timeout=20)
        except Exception:
            s.kill()


@pytest.fixture(scope="session")
def tiny(start_server) -> Server:
    """The tiny model (stories260K: 512-token context, no chat template), no speculation."""
    return start_server(["-m", str(TINY)])


@pytest.fixture(scope="session")
def tiny_ngram(start_server) -> Server:
    """The tiny model with n-gram speculation."""
    return start_server(["-m", str(TINY), "--spec", "ngram"])


@pytest.fixture(scope="session")
def tiny_draft(start_server) -> Server:
    """The tiny model with a draft model (tinystories280K) speculating."""
    return start_server(["-m", str(TINY), "--spec", "draft", "--draft-model", str(TINY_DRAFT)])


@pytest.fixture(scope="session")
def smol(start_server) -> Server:
    """The default model (SmolLM2-135M-Instruct, with its ChatML template), n-gram speculation."""
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"{DEFAULT_MODEL} is missing: run scripts/setup.sh")
    return start_server(["--spec", "ngram"])


def generate(args: list[str]) -> dict:
    """`specdec generate ... --output-format json` (greedy unless args say otherwise)."""
    out = subprocess.run([str(BINARY), "generate", "-t", "2", "--output-format", "json", *args],
                         capture_output=True, timeout=120, check=True)
    return json.loads(out.stdout)


def assert_error(status: int, body: dict, expected_status: int, param=None, code=None):
    assert status == expected_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err
