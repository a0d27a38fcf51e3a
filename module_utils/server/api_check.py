"""Checks of the OpenAI-compatible API a healthy SGLang server offers its users, and the record
of them (api-check.json).

/health_generate proves that the model generates, not that users can call it: a wrong
--served-model-name, a missing chat template, a tool-call or reasoning parser that does not
engage all pass it. Each check here sends what a user's client sends and says, on failure,
what came back, what was expected and what to check. Shapes follow SGLang 0.5.23
(python/sglang/srt/entrypoints/openai/protocol.py; serving_chat.py handle_request,
_build_chat_response, _process_tool_calls; http_server.py available_models).

The checks: `models` (GET /v1/models names the served model), `chat` (a non-streamed chat
completion with content), `chat_stream` (the same streamed: chunks, a finish reason, [DONE]),
`tool_call` (tools with a forced tool_choice come back as a parsed tool call) and `reasoning`
(the reasoning arrives in reasoning_content, not in the content). A check whose parser the
launch does not configure is not run (passed null, found says why).

Standard library only (modules ship it to hosts). Every request has a deadline, every answer
is read bounded and type-checked, and the API key is sent as a bearer token and masked out of
anything recorded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from datetime import datetime, timezone

from ansible.module_utils.contract.launch import flag_value
from ansible.module_utils.contract.level import API_CHECK_KIND as KIND
from ansible.module_utils.contract.level import API_CHECK_SCHEMA_VERSION as SCHEMA_VERSION
from ansible.module_utils.host.helpers import mask_secrets

CHECKS = ("models", "chat", "chat_stream", "tool_call", "reasoning")
MAX_BODY = 1 << 20  # one answer's bytes
MAX_STREAM = 4 << 20  # one stream's bytes
MAX_EVENTS = 20_000
MAX_TEXT = 300  # found/expected/fix as recorded
# Special-token markers: their presence in content means the template or a parser let the
# model's own framing through (<think>, K2's <|tool_calls_section_begin|>, <|im_end|>).
LEAKS = ("<think>", "</think>", "<|")
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}
CHAT_PROMPT = "Reply with one short sentence: what is the capital of France?"
REASONING_PROMPT = "What is 17 + 25? Think it through, then give the number."
TOOL_PROMPT = "What is the weather in Paris right now? Use the tool."


class ApiError(Exception):
    """A request that did not get a usable answer; the text says what came back."""


def launch_value(argv: list, flag: str) -> str:
    """The value of `flag` in a launch argv ("" when absent); `--flag=value` too. Items are
    taken as their text (a rendered argv may hold numbers)."""
    return flag_value([str(arg) for arg in argv], flag) or ""


def expectations(argv: list) -> dict:
    """What the launch asks of the server: the name /v1/models must give (--served-model-name,
    else the model path, as SGLang's serving_hook resolves it) and the parsers."""
    return {
        "served_model_name": launch_value(argv, "--served-model-name")
        or launch_value(argv, "--model-path"),
        "tool_call_parser": launch_value(argv, "--tool-call-parser"),
        "reasoning_parser": launch_value(argv, "--reasoning-parser"),
    }


def clip(value, limit: int = MAX_TEXT) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Client:
    """HTTP/1.1 to one server: a new connection per request, each under the time left of
    its own deadline; the key as a bearer token."""

    def __init__(self, base_url: str, api_key: str = "", timeout: float = 120.0):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.parsed = parsed
        self.api_key = api_key
        self.timeout = float(timeout)

    @contextlib.contextmanager
    def exchange(self, method: str, path: str, body: dict | None):
        """One request's response, whole within the timeout: a watchdog shuts the socket down
        at the deadline, so a server that drips bytes cannot hold a read past it."""
        deadline = time.monotonic() + self.timeout
        kind = http.client.HTTPSConnection if self.parsed.scheme == "https" else None
        kind = kind or http.client.HTTPConnection
        connection = kind(self.parsed.hostname, self.parsed.port, timeout=self.timeout)
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"

        opened: list = []

        def cut() -> None:
            # The socket itself: once the answer says it will close, the connection hands it
            # to the response and forgets it.
            for sock in opened:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(self.timeout, cut)
        watchdog.daemon = True
        watchdog.start()
        stage = "no answer"
        try:
            connection.connect()
            opened.append(connection.sock)
            connection.request(method, self.parsed.path.rstrip("/") + path, data, headers)
            response = connection.getresponse()
            stage = "the answer broke off"
            yield response
        except (OSError, http.client.HTTPException) as error:
            if time.monotonic() >= deadline:
                raise ApiError(
                    f"{method} {path}: no whole answer within {self.timeout:g} s"
                ) from None
            raise ApiError(f"{method} {path}: {stage} ({error or type(error).__name__})") from None
        finally:
            watchdog.cancel()
            connection.close()
        if time.monotonic() >= deadline:
            raise ApiError(f"{method} {path}: no whole answer within {self.timeout:g} s")

    def json(self, method: str, path: str, body: dict | None = None) -> dict:
        with self.exchange(method, path, body) as response:
            raw = response.read(MAX_BODY + 1)
            status = response.status
        if len(raw) > MAX_BODY:
            raise ApiError(f"{method} {path}: an answer over {MAX_BODY} bytes")
        return self._decode(method, path, status, raw)

    @staticmethod
    def _decode(method: str, path: str, status: int, raw: bytes) -> dict:
        text = raw.decode("utf-8", "replace")
        if status != 200:
            hint = " (the API key: kimi_server_api_key)" if status == 401 else ""
            raise ApiError(f"{method} {path}: HTTP {status}{hint}: {clip(text, 200)}")
        try:
            data = json.loads(text)
        except ValueError:
            raise ApiError(f"{method} {path}: not JSON: {clip(text, 200)}") from None
        if not isinstance(data, dict):
            raise ApiError(f"{method} {path}: a JSON {type(data).__name__}, not an object")
        return data

    def stream(self, path: str, body: dict) -> tuple[list[dict], bool]:
        """The `data:` events of a server-sent stream as objects, and whether [DONE] came."""
        events: list[dict] = []
        done, total = False, 0
        with self.exchange("POST", path, body) as response:
            if response.status != 200:
                self._decode("POST", path, response.status, response.read(MAX_BODY))
            while not done:
                line = response.readline(MAX_BODY + 1)
                if not line:
                    break
                total += len(line)
                if len(line) > MAX_BODY or total > MAX_STREAM or len(events) >= MAX_EVENTS:
                    raise ApiError(f"POST {path}: a stream over {MAX_STREAM} bytes or events")
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue
                payload = text[5:].strip()
                if payload == "[DONE]":
                    done = True
                    continue
                try:
                    event = json.loads(payload)
                except ValueError:
                    problem = f"POST {path}: an event that is not JSON: {clip(payload, 200)}"
                    raise ApiError(problem) from None
                if not isinstance(event, dict):
                    raise ApiError(f"POST {path}: an event that is not an object")
                events.append(event)
        return events, done


def first_choice(answer: dict) -> dict:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ApiError(f"no choices in the answer: {clip(answer, 200)}")
    return choices[0]


def message_of(answer: dict) -> dict:
    message = first_choice(answer).get("message")
    if not isinstance(message, dict):
        raise ApiError(f"choices[0] has no message: {clip(answer, 200)}")
    return message


def chat_body(want: dict, prompt: str, max_tokens: int, kwargs: dict | None = None, **extra):
    """A chat completion request for the served model, greedy."""
    body = {
        "model": want["served_model_name"],
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def leaked(text: str) -> str:
    """The first special marker found in text, or ""."""
    return next((marker for marker in LEAKS if marker in text), "")


def result(name: str, passed, found: str, expected: str, fix: str = "") -> dict:
    return {
        "name": name,
        "passed": passed,
        "found": clip(found),
        "expected": clip(expected),
        "fix": clip(fix) if passed is not True else "",
    }


def check_models(client: Client, want: dict) -> dict:
    expected = f"/v1/models lists {want['served_model_name']!r}"
    answer = client.json("GET", "/v1/models")
    data = answer.get("data")
    ids = (
        [item.get("id") for item in data if isinstance(item, dict)]
        if isinstance(data, list)
        else []
    )
    ids = [str(i) for i in ids if isinstance(i, str)][:16]
    if want["served_model_name"] in ids:
        return result("models", True, f"models: {', '.join(ids)}", expected)
    return result(
        "models",
        False,
        f"models: {', '.join(ids) or '(none)'}",
        expected,
        "clients ask for the model by this name: check --served-model-name in the launch "
        "(kimi_served_model_name) and that the server on this port is the one launched",
    )


CHAT_FIX = (
    "check the model folder's chat template (tokenizer_config.json or chat_template.jinja), the "
    "reasoning parser (--reasoning-parser) and the runtime's version"
)


def check_chat(client: Client, want: dict, kwargs: dict) -> dict:
    expected = "a chat.completion whose message has content without the model's markers"
    answer = client.json("POST", "/v1/chat/completions", chat_body(want, CHAT_PROMPT, 256, kwargs))
    message = message_of(answer)
    content = message.get("content")
    finish = first_choice(answer).get("finish_reason")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    found = f"{answer.get('object')}, finish_reason {finish}, content {clip(content, 120)!r}"
    problem = ""
    if answer.get("object") != "chat.completion":
        problem = "object is not chat.completion"
    elif not isinstance(content, str) or not content.strip():
        problem = "no content"
    elif leaked(content):
        problem = f"content holds {leaked(content)}"
    elif not isinstance(usage.get("completion_tokens"), int) or usage["completion_tokens"] < 1:
        problem = "usage.completion_tokens missing"
    if problem:
        return result("chat", False, f"{problem}: {found}", expected, CHAT_FIX)
    return result("chat", True, found, expected)


def check_chat_stream(client: Client, want: dict, kwargs: dict) -> dict:
    expected = "chat.completion.chunk events with content, a finish_reason, then data: [DONE]"
    body = chat_body(
        want, CHAT_PROMPT, 256, kwargs, stream=True, stream_options={"include_usage": True}
    )
    events, done = client.stream("/v1/chat/completions", body)
    content, finish, kinds = [], None, set()
    for event in events:
        kinds.add(str(event.get("object")))
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            finish = choice.get("finish_reason") or finish
    text = "".join(content)
    found = (
        f"{len(events)} events ({', '.join(sorted(kinds)) or 'none'}), finish_reason {finish}, "
        f"[DONE] {'seen' if done else 'missing'}, content {clip(text, 100)!r}"
    )
    problem = ""
    if kinds != {"chat.completion.chunk"}:
        problem = "events are not chat.completion.chunk"
    elif not done:
        problem = "no data: [DONE]"
    elif finish is None:
        problem = "no finish_reason"
    elif not text.strip():
        problem = "no content"
    elif leaked(text):
        problem = f"content holds {leaked(text)}"
    if problem:
        return result("chat_stream", False, f"{problem}: {found}", expected, CHAT_FIX)
    return result("chat_stream", True, found, expected)


def check_tool_call(client: Client, want: dict) -> dict:
    parser = want["tool_call_parser"]
    expected = "message.tool_calls[0]: function get_weather with JSON arguments holding city"
    if not parser:
        return result("tool_call", None, "not run: the launch has no --tool-call-parser", expected)
    forced = {"type": "function", "function": {"name": "get_weather"}}
    body = chat_body(want, TOOL_PROMPT, 1024, tools=[TOOL], tool_choice=forced)
    answer = client.json("POST", "/v1/chat/completions", body)
    message = message_of(answer)
    calls = message.get("tool_calls")
    fix = (
        f"the launch sets --tool-call-parser {parser}: check that it is the model's parser, that "
        "the runtime's version has it and that the chat template renders tools"
    )
    if not isinstance(calls, list) or not calls or not isinstance(calls[0], dict):
        content = message.get("content")
        found = f"no tool_calls; content {clip(content, 160)!r}"
        return result("tool_call", False, found, expected, fix)
    function = calls[0].get("function") if isinstance(calls[0].get("function"), dict) else {}
    name, arguments = function.get("name"), function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = None
    found = f"tool_calls[0] {name!r} arguments {clip(arguments, 120)}"
    if (
        name != "get_weather"
        or not isinstance(parsed, dict)
        or not isinstance(parsed.get("city"), str)
    ):
        return result("tool_call", False, found, expected, fix)
    return result("tool_call", True, found, expected)


def check_reasoning(client: Client, want: dict) -> dict:
    parser = want["reasoning_parser"]
    expected = "message.reasoning_content holds the reasoning; content holds no think markers"
    if not parser:
        return result("reasoning", None, "not run: the launch has no --reasoning-parser", expected)
    answer = client.json("POST", "/v1/chat/completions", chat_body(want, REASONING_PROMPT, 1024))
    message = message_of(answer)
    reasoning, content = message.get("reasoning_content"), message.get("content")
    content = content if isinstance(content, str) else ""
    found = f"reasoning_content {clip(reasoning, 80)!r}, content {clip(content, 80)!r}"
    fix = (
        f"the launch sets --reasoning-parser {parser}: check that it is the model's parser, that "
        "the runtime's version has it and that the chat template leaves thinking on by default"
    )
    if not isinstance(reasoning, str) or not reasoning.strip():
        problem = "reasoning inside the content" if leaked(content) else "no reasoning_content"
        return result("reasoning", False, f"{problem}: {found}", expected, fix)
    if leaked(content):
        return result(
            "reasoning", False, f"content holds {leaked(content)}: {found}", expected, fix
        )
    return result("reasoning", True, found, expected)


def run_checks(
    base_url: str,
    argv: list,
    config: str = "",
    api_key: str = "",
    timeout: float = 120.0,
    chat_template_kwargs: dict | None = None,
    now=None,
) -> dict:
    """Every check against the server at base_url that `argv` launched; the api-check.json
    record (the key masked out of every text in it)."""
    want = expectations(argv)
    client = Client(base_url, api_key, timeout)
    kwargs = dict(chat_template_kwargs or {})
    runs = {
        "models": lambda: check_models(client, want),
        "chat": lambda: check_chat(client, want, kwargs),
        "chat_stream": lambda: check_chat_stream(client, want, kwargs),
        "tool_call": lambda: check_tool_call(client, want),
        "reasoning": lambda: check_reasoning(client, want),
    }
    checks = []
    for name in CHECKS:
        started = time.monotonic()
        try:
            outcome = runs[name]()
        except ApiError as error:
            outcome = result(
                name,
                False,
                str(error),
                "an answer",
                "check that the server is up on this address, the API key and the server's log",
            )
        outcome["ms"] = round((time.monotonic() - started) * 1000, 1)
        checks.append(outcome)
    record = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "checked_at": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),  # noqa: UP017
        "base_url": base_url,
        "served_model_name": want["served_model_name"],
        "config": config,
        "passed": all(check["passed"] is not False for check in checks),
        "checks": checks,
    }
    return mask_secrets(record, [api_key] if api_key else [])


def failures(record: dict) -> list[str]:
    """One line per failed check: its name, what was found, expected, and the fix."""
    return [
        f"{check['name']}: found {check['found']}; expected {check['expected']}; "
        f"fix: {check['fix']}"
        for check in record.get("checks", [])
        if check.get("passed") is False
    ]


def outcome_of(record: dict | None) -> object:
    """The record without what changes on every run (when, how long), to tell whether a new
    check's outcome differs from the last one's."""
    if not isinstance(record, dict):
        return None
    checks = record.get("checks") if isinstance(record.get("checks"), list) else []
    return {
        **{k: v for k, v in record.items() if k not in ("checked_at", "checks")},
        "checks": [
            {k: v for k, v in c.items() if k != "ms"} for c in checks if isinstance(c, dict)
        ],
    }
