"""Fixtures for the `specdec serve` tests: live servers on free loopback ports.

Every server is `build/specdec serve --port 0` (the server picks a free port and prints it), its
log in pytest's temporary directory; the tests talk to 127.0.0.1 only, to servers they started,
with bounded request counts and timeouts.

Environment: SPECDEC_BUILD_DIR (default build/), SPECDEC_SHARED_DIR (default ../shared: the tiny
models), SPECDEC_CACHE (default ~/.cache/specdec: the default model, SmolLM2, which has a chat
template; the tiny model has none).

SPECDEC_SERVER_SANITIZER=thread: the binary was built with ThreadSanitizer (build-tsan/, see
scripts/sanitize.sh). Every specdec process the tests start then writes its reports to files
(TSAN_OPTIONS log_path, halt_on_error=0: the server goes on, so later tests still run), with
tests/server/tsan.supp as suppressions; a test during which a new report appears (in those files
or in a server's log) fails with the report, and so does the session's end when one appears
while the servers shut down. The servers then get a 32 MiB KV pool unless a test sets one.
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
SANITIZER = os.environ.get("SPECDEC_SERVER_SANITIZER", "")
if SANITIZER not in ("", "thread"):
    raise RuntimeError(f"SPECDEC_SERVER_SANITIZER={SANITIZER!r}: use thread or nothing")
TSAN_SUPPRESSIONS = Path(__file__).resolve().parent / "tsan.supp"
SANITIZER_MARK = "WARNING: ThreadSanitizer"
# Every Server started in this session (their logs are scanned for sanitizer reports).
SERVERS: list["Server"] = []


class Server:
    """A `specdec serve` process on 127.0.0.1 and a port it chose."""

    def __init__(self, args: list[str], log_path: Path, env: dict | None = None):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "wb")
        if SANITIZER and "--kv-cache-mib" not in args:
            # TSan shadows every byte of the KV pool: the default 256 MiB make a server of the
            # tiny model take 1.6 GB instead of 0.3, and a session keeps a dozen servers.
            args = [*args, "--kv-cache-mib", "32"]
        cmd = [str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0", "-t", "2", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.reports_seen = 0  # sanitizer reports in the log already charged to a test
        SERVERS.append(self)
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


class SanitizerReports:
    """The reports of the sanitized specdec processes: files `<dir>/tsan.<pid>` and the lines
    of the servers' logs, each report charged once."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.sizes: dict[Path, int] = {}

    def new_reports(self) -> list[str]:
        found = []
        for f in sorted(self.directory.glob("tsan.*")):
            data = f.read_text(errors="replace")
            old = self.sizes.get(f, 0)
            if len(data) > old:
                self.sizes[f] = len(data)
                if SANITIZER_MARK in data[old:]:
                    found.append(f"{f}:\n{data[old:][:6000]}")
        for s in SERVERS:
            text = s.log_text()
            parts = text.split(SANITIZER_MARK)  # [before the first, after each report]
            if len(parts) - 1 > s.reports_seen:
                first_new = SANITIZER_MARK + parts[s.reports_seen + 1]
                s.reports_seen = len(parts) - 1
                found.append(f"{s.log_path} ({' '.join(s.args)}):\n{first_new[:6000]}")
        return found


@pytest.fixture(scope="session", autouse=True)
def _sanitizer_session(tmp_path_factory):
    """With SPECDEC_SERVER_SANITIZER=thread: TSan's options for every process started from
    here on; at the end (after the servers were stopped: this fixture is torn down last), the
    reports no test was charged with fail the session."""
    if not SANITIZER:
        yield None
        return
    directory = tmp_path_factory.mktemp("tsan")
    options = ["halt_on_error=0", "exitcode=66", "second_deadlock_stack=1",
               f"log_path={directory / 'tsan'}"]
    if TSAN_SUPPRESSIONS.exists():
        options.append(f"suppressions={TSAN_SUPPRESSIONS}")
    old = os.environ.get("TSAN_OPTIONS")
    os.environ["TSAN_OPTIONS"] = ":".join(filter(None, [old, *options]))
    reports = SanitizerReports(directory)
    yield reports
    if old is None:
        os.environ.pop("TSAN_OPTIONS", None)
    else:
        os.environ["TSAN_OPTIONS"] = old
    found = reports.new_reports()
    if found:
        pytest.fail("ThreadSanitizer reports while the servers shut down:\n" + "\n".join(found),
                    pytrace=False)


@pytest.fixture(autouse=True)
def _no_sanitizer_report(_sanitizer_session):
    """Fails the test during which a sanitizer report appeared (in any process it started or
    any server still running)."""
    yield
    if _sanitizer_session is not None:
        found = _sanitizer_session.new_reports()
        if found:
            pytest.fail("ThreadSanitizer reports during this test:\n" + "\n".join(found),
                        pytrace=False)


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
