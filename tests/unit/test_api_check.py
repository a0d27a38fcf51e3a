"""The API checks after health (module_utils/server/api_check.py) against the simulator's OpenAI
API:
a healthy launch passes all five, and each way a launch can fail its users fails its own check
with what was found, what was expected and what to check."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time

import pytest

from tests.support.results_tree import TEMPLATE
from tests.support.sim_process import start, stop

pytestmark = pytest.mark.runtime

NAME = "moonshotai/Kimi-K2.6"
KEY = "sk-api-check-test-93d1"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return str(folder)


def launch(model: str, *, tool=True, reasoning=True, name=NAME, extra=()) -> list[str]:
    argv = ["--model-path", model, "--host", "127.0.0.1", "--served-model-name", name]
    if tool:
        argv += ["--tool-call-parser", "kimi_k2"]
    if reasoning:
        argv += ["--reasoning-parser", "kimi_k2"]
    return [*argv, *extra]


def checks_of(record: dict) -> dict:
    return {check["name"]: check for check in record["checks"]}


def run(url: str, argv: list[str], **kwargs) -> dict:
    from ansible.module_utils.server.api_check import run_checks

    return run_checks(url, argv, config="dflash", timeout=20, **kwargs)


def test_a_healthy_launch_passes_every_check(model):
    argv = launch(model)
    process, url = start(argv, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_PREFILL_MS=5)
    try:
        record = run(url, argv, chat_template_kwargs={"thinking": False})
    finally:
        stop(process)
    assert record["kind"] == "kimi.api_check" and record["schema_version"] == 1
    assert record["served_model_name"] == NAME and record["config"] == "dflash"
    assert record["base_url"] == url
    checks = checks_of(record)
    assert list(checks) == ["models", "chat", "chat_stream", "tool_call", "reasoning"]
    assert {name: check["passed"] for name, check in checks.items()} == dict.fromkeys(checks, True)
    assert record["passed"] is True
    assert NAME in checks["models"]["found"]
    assert "tool_calls[0] 'get_weather'" in checks["tool_call"]["found"]
    assert all(check["fix"] == "" and check["ms"] > 0 for check in checks.values())
    # What the report reads it with (analysis/results_side.py) takes it as it is.
    from jsonschema import Draft202012Validator

    from analysis.results import API_CHECK_SCHEMA

    assert list(Draft202012Validator(API_CHECK_SCHEMA).iter_errors(record)) == []


def test_without_parsers_in_the_launch_those_checks_are_not_run(model):
    argv = launch(model, tool=False, reasoning=False)
    process, url = start(argv, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_PREFILL_MS=5)
    try:
        record = run(url, argv)
    finally:
        stop(process)
    checks = checks_of(record)
    assert checks["tool_call"]["passed"] is None
    assert "no --tool-call-parser" in checks["tool_call"]["found"]
    assert checks["reasoning"]["passed"] is None
    # Thinking left on (no kwargs) and no parser: the chat's content holds the think markers.
    assert checks["chat"]["passed"] is False and "content holds <think>" in checks["chat"]["found"]
    assert record["passed"] is False


@pytest.mark.parametrize("ignored", ["tool_call", "tool_call,reasoning"])
def test_a_server_whose_parsers_do_not_engage_fails_those_checks(model, ignored):
    """The launch asks for kimi_k2 parsers, the server runs without them: the forced tool
    choice comes back as JSON text in content (SGLang's json_schema constraint, unparsed), the
    reasoning inside the content. Each failure is its own check's; the others pass."""
    from ansible.module_utils.server.api_check import failures

    argv = launch(model)
    process, url = start(
        argv, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_PREFILL_MS=5, SGLANG_SIM_IGNORE_PARSERS=ignored
    )
    try:
        record = run(url, argv, chat_template_kwargs={"thinking": False})
    finally:
        stop(process)
    checks = checks_of(record)
    assert [checks[n]["passed"] for n in ("models", "chat", "chat_stream")] == [True] * 3
    tool = checks["tool_call"]
    assert tool["passed"] is False
    assert tool["found"].startswith('no tool_calls; content \'[{"name": "get_weather"')
    assert "--tool-call-parser kimi_k2" in tool["fix"]
    reasoning = checks["reasoning"]
    lines = failures(record)
    if ignored == "tool_call":
        assert reasoning["passed"] is True
        assert [line.split(":", 1)[0] for line in lines] == ["tool_call"]
    else:
        assert reasoning["passed"] is False
        assert reasoning["found"].startswith("reasoning inside the content")
        assert "--reasoning-parser kimi_k2" in reasoning["fix"]
        assert [line.split(":", 1)[0] for line in lines] == ["tool_call", "reasoning"]
    assert "expected message.tool_calls[0]" in lines[0]


def test_a_wrong_served_name_and_a_missing_key_say_so(model):
    argv = launch(model, name="kimi", extra=["--api-key", KEY])
    process, url = start(argv, SGLANG_SIM_STEP_MS=2, SGLANG_SIM_PREFILL_MS=5)
    try:
        wrong_name = run(url, launch(model, extra=["--api-key", KEY]), api_key=KEY)
        no_key = run(url, argv)
    finally:
        stop(process)
    models = checks_of(wrong_name)["models"]
    assert models["passed"] is False
    assert models["found"] == "models: kimi"
    assert "--served-model-name" in models["fix"]
    assert KEY not in json.dumps(wrong_name) and KEY not in json.dumps(no_key)
    for check in no_key["checks"]:
        assert check["passed"] is False
        assert "HTTP 401 (the API key: kimi_server_api_key)" in check["found"]


class Hostile(http.server.BaseHTTPRequestHandler):
    """A server that answers badly: too much, not JSON, nothing until the deadline, or a byte
    at a time, each within the socket's timeout but the whole past the deadline."""

    def do_GET(self):
        # The client cuts the connection (which is the point): a write after that fails.
        with contextlib.suppress(ConnectionError):
            self.answer()

    def answer(self):
        if self.path.startswith("/drip"):
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                if self.server.done.wait(0.2):
                    return
            return
        if self.path.startswith("/slow") and self.server.done.wait(3):
            return
        body = b"[" * (2 << 20) if self.path.startswith("/big") else b"<html>no</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class HostileServer(http.server.ThreadingHTTPServer):
    """Its answers end with the test: server_close() waits for them (a slow one, still
    sleeping after the client gave up, would otherwise write into a later test's stderr)."""

    daemon_threads = False

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Hostile)
        self.done = threading.Event()


def test_answers_are_bounded_and_deadlined():
    from ansible.module_utils.server.api_check import ApiError, Client

    server = HostileServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ApiError, match="an answer over 1048576 bytes"):
            Client(base + "/big", timeout=5).json("GET", "/v1/models")
        with pytest.raises(ApiError, match="not JSON: <html>no</html>"):
            Client(base, timeout=5).json("GET", "/v1/models")
        began = time.monotonic()
        with pytest.raises(ApiError, match=r"no whole answer within 0\.5 s"):
            Client(base + "/slow", timeout=0.5).json("GET", "/v1/models")
        assert time.monotonic() - began < 2.5
        began = time.monotonic()
        with pytest.raises(ApiError, match="no whole answer within 1 s"):
            Client(base + "/drip", timeout=1).json("GET", "/v1/models")
        assert time.monotonic() - began < 2.5
    finally:
        server.done.set()
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="http"):
        Client("file:///etc/passwd")


def test_expectations_come_from_the_launch():
    from ansible.module_utils.server.api_check import expectations, outcome_of

    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/w/t", "--reasoning-parser=x"]
    assert expectations(argv) == {
        "served_model_name": "/w/t",
        "tool_call_parser": "",
        "reasoning_parser": "x",
    }
    named = expectations([*argv, "--served-model-name", NAME, "--tool-call-parser", "kimi_k2"])
    assert named["served_model_name"] == NAME and named["tool_call_parser"] == "kimi_k2"
    one = {"checked_at": "a", "passed": True, "checks": [{"name": "chat", "ms": 1.0}]}
    two = {"checked_at": "b", "passed": True, "checks": [{"name": "chat", "ms": 9.0}]}
    assert outcome_of(one) == outcome_of(two)
    assert outcome_of(one) != outcome_of({**two, "passed": False})
