"""The benchmark's pure parts, shared by sglang_benchmark, benchmark_prompts and
benchmark_lossless: the HTTP/SSE stream parser, per-request and per-level statistics, the
losslessness comparison and chat-template rendering.

Standard library only: this runs on GPU hosts under whatever Python they have. jinja2 (for
chat templates) is imported only by the function that renders.

Why a parser of our own: a streamed /generate answer from SGLang is an HTTP/1.1 response
(chunked under uvicorn, close-delimited from simpler servers) whose body is server-sent
events, `data: {json}` lines ending with `data: [DONE]`. Feeding it raw socket reads from
asyncio's Protocol callbacks, and stamping each event with the time of the read that
delivered it, keeps the client's cost per event at a few microseconds.

The stream's shape (SGLang 0.5.23, python/sglang/srt/managers/tokenizer_manager.py
_handle_batch_output): `text` and `output_ids` are cumulative; the first event carries the
one token prefill produced; each later event one verify step's tokens (the accepted drafts
and the bonus token), or one token without speculation; meta_info.completion_tokens counts
them all. Only the last event carries spec_verify_ct (verify steps, the prefill token being
none of them) and spec_accept_length = completion_tokens / spec_verify_ct, which counts the
prefill token as if a verify step had produced it. The kit's accepted tokens per step
leaves it out: (completion_tokens - 1) / spec_verify_ct, the tokens each verify step added.
"""

from __future__ import annotations

import json
import math
import os
import re

SCHEMA_VERSION = 1

# meta_info's completion_tokens, found from the end of an event: meta_info is the last key
# of SGLang's event dict, and the text before it holds quotes only escaped (\"), so the
# unescaped key cannot occur inside it.
_COMPLETION_KEY = b'"completion_tokens":'
_DIGITS = b"0123456789"
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class StreamError(Exception):
    """The response is not a well-formed HTTP response."""


class ResponseParser:
    """Incremental parser of one HTTP/1.1 response whose body is server-sent events.

    feed(data) returns the events completed by that data: the `data:` lines of each event
    (bytes, without the `data:` prefix, joined by newlines), once the blank line that ends
    the event has arrived. status and headers are set once the head is in; body holds the
    body of a non-200 response (for the error message); finished is set when the body has
    ended (last chunk, Content-Length reached); a close-delimited body ends with the
    connection. inside_event says that the body stopped in the middle of an event: a line
    not ended, or data lines without the blank line after them.
    """

    MAX_HEAD = 65536
    MAX_ERROR_BODY = 4096
    MAX_CHUNK_SIZE_LINE = 1024
    # One event holds the whole output so far (cumulative text and ids): room for very long
    # answers, a bound against a server that never ends a line. The client never holds more
    # of an event than this plus one read.
    MAX_EVENT = 16 << 20

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.finished = False
        self._head = bytearray()
        self._mode = ""  # chunked, length or close
        self._remaining = 0  # bytes left in the current chunk or the whole body
        self._chunk_state = "size"  # size, data, crlf, trailer
        self._raw = bytearray()  # undecoded chunked framing
        self._line = bytearray()  # the body's current line, not ended yet
        self._data: list[bytes] = []  # data lines of the current event
        self._event_size = 0

    @property
    def inside_event(self) -> bool:
        return bool(self._line or self._data)

    def feed(self, data: bytes) -> list[bytes]:
        if self.status is None:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > self.MAX_HEAD:
                    raise StreamError("response head longer than 64 KiB")
                return []
            self._parse_head(bytes(self._head[:end]))
            data = bytes(self._head[end + 4 :])
            self._head = bytearray()
        if self.finished or not data:
            return []
        if self._mode == "chunked":
            body = self._dechunk(data)
        elif self._mode == "length":
            body = data[: self._remaining]
            self._remaining -= len(body)
            self.finished = self._remaining <= 0
        else:
            body = data
        if self.status != 200:
            room = self.MAX_ERROR_BODY - len(self.body)
            if room > 0:
                self.body += body[:room]
            return []
        return self._events(body)

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = parts[1] if len(parts) > 1 else ""
        if not parts[0].startswith("HTTP/") or not (status.isascii() and status.isdigit()):
            raise StreamError(f"not an HTTP response: {lines[0][:80]!r}")
        self.status = int(status[:3])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in self.headers:
            length = self.headers["content-length"]
            if not (length.isascii() and length.isdigit()) or len(length) > 15:
                raise StreamError(f"bad content-length {length[:20]!r}")
            self._mode = "length"
            self._remaining = int(length)
            self.finished = self._remaining == 0
        else:
            self._mode = "close"

    def _dechunk(self, data: bytes) -> bytes:
        self._raw += data
        out = bytearray()
        # Each pass consumes at least one framing element; bounded by the bytes at hand.
        for _ in range(len(self._raw) + 2):
            if self._chunk_state == "size":
                end = self._raw.find(b"\r\n")
                if end < 0:
                    if len(self._raw) > self.MAX_CHUNK_SIZE_LINE:
                        raise StreamError("chunk size line longer than 1 KiB")
                    break
                size_text = bytes(self._raw[:end]).split(b";", 1)[0].strip()
                try:
                    # int() would also take signs, underscores and a 0x prefix.
                    if not size_text or size_text.strip(_HEX_DIGITS) or len(size_text) > 16:
                        raise ValueError
                    self._remaining = int(size_text, 16)
                except ValueError:
                    raise StreamError(f"bad chunk size {size_text[:20]!r}") from None
                del self._raw[: end + 2]
                self._chunk_state = "data" if self._remaining else "trailer"
            elif self._chunk_state == "data":
                if not self._raw:
                    break
                piece = self._raw[: self._remaining]
                out += piece
                del self._raw[: len(piece)]
                self._remaining -= len(piece)
                if self._remaining == 0:
                    self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(self._raw) < 2:
                    break
                if self._raw[:2] != b"\r\n":
                    raise StreamError("chunk data not followed by CRLF")
                del self._raw[:2]
                self._chunk_state = "size"
            else:  # trailer: the body is complete; what follows does not matter
                self.finished = True
                self._raw = bytearray()
                break
        return bytes(out)

    def _events(self, body: bytes) -> list[bytes]:
        found: list[bytes] = []
        start = 0
        while True:
            # Only the new bytes are searched: a long line is not scanned again per read.
            end = body.find(b"\n", start)
            if end < 0:
                break
            if self._line:
                self._line += body[start:end]
                line, self._line = bytes(self._line), bytearray()
            else:
                line = body[start:end]
            start = end + 1
            self._take(line.rstrip(b"\r"), found)
        rest = len(body) - start
        if rest:
            if self._event_size + len(self._line) + rest > self.MAX_EVENT:
                raise StreamError(f"an event longer than {self.MAX_EVENT >> 20} MiB")
            self._line += body[start:]
        return found

    def _take(self, line: bytes, found: list[bytes]) -> None:
        """One line of the event stream (the HTML standard's server-sent events)."""
        if not line:  # a blank line ends the event
            if self._data:
                found.append(b"\n".join(self._data))
            self._data, self._event_size = [], 0
            return
        if not line.startswith(b"data:"):
            return  # comments, event:, id: and retry: carry nothing the benchmark reads
        value = line[5:]
        if value[:1] == b" ":
            value = value[1:]
        self._event_size += len(value) + 1
        if self._event_size > self.MAX_EVENT:
            raise StreamError(f"an event longer than {self.MAX_EVENT >> 20} MiB")
        self._data.append(value)

    def close(self) -> None:
        """The connection closed. An event without the blank line that ends it is not one:
        inside_event stays set, and the caller counts the stream as cut."""
        self._raw = bytearray()


def completion_tokens(payload: bytes) -> int | None:
    """meta_info.completion_tokens of one event, without decoding the (cumulative) text: a
    count of at most 13 digits ended by `,` or `}`; None for anything else (the caller
    decodes the event then, and says what is wrong with it)."""
    index = payload.rfind(_COMPLETION_KEY)
    if index < 0:
        return None
    index += len(_COMPLETION_KEY)
    end = len(payload)
    while index < end and payload[index] == 32:  # spaces
        index += 1
    start = index
    while index < end and payload[index] in _DIGITS and index - start <= 13:
        index += 1
    if index == start or index - start > 13:
        return None
    after = index
    while after < end and payload[after] == 32:
        after += 1
    if after >= end or payload[after] not in b",}":
        return None
    return int(payload[start:index])


def percentile(ordered: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of sorted values."""
    if not ordered:
        return 0.0
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict:
    """mean, p50, p90, p99, max and count, rounded to microseconds when in ms."""
    ordered = sorted(values)
    if not ordered:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None, "count": 0}
    return {
        "mean": round(sum(ordered) / len(ordered), 4),
        "p50": round(percentile(ordered, 0.5), 4),
        "p90": round(percentile(ordered, 0.9), 4),
        "p99": round(percentile(ordered, 0.99), 4),
        "max": round(ordered[-1], 4),
        "count": len(ordered),
    }


def request_timings(start: float, events: list[tuple[float, int]], done: float | None) -> dict:
    """Per-request timings from (arrival time, cumulative completion tokens) of each event.

    TTFT is the first event's arrival. An event's gap to the previous one is split evenly
    over the tokens it carries (speculative decoding delivers several per event), so ITL is
    per token; an event that carries none adds its gap to the next. TPOT is the decode time
    after the first event over the tokens that came after it. E2E ends at [DONE] (or the last
    event when the stream ended without it).
    """
    itl: list[float] = []
    if not events:
        return {"ttft_ms": None, "e2e_ms": None, "tpot_ms": None, "itl_ms": itl, "decode_ms": 0.0}
    first_time, first_tokens = events[0]
    last_time, last_tokens = first_time, first_tokens
    for when, tokens in events[1:]:
        new = tokens - last_tokens
        if new <= 0:
            continue
        gap = (when - last_time) * 1000.0 / new
        itl.extend([gap] * new)
        last_time, last_tokens = when, tokens
    decode_ms = (last_time - first_time) * 1000.0
    after_first = last_tokens - first_tokens
    end = done if done is not None else last_time
    return {
        "ttft_ms": (first_time - start) * 1000.0,
        "e2e_ms": (end - start) * 1000.0,
        "tpot_ms": decode_ms / after_first if after_first > 0 else None,
        "itl_ms": itl,
        "decode_ms": decode_ms,
    }


def decode_steps(first_meta: dict, last_meta: dict) -> int:
    """Forward steps between the first and the last event: verify steps under speculation,
    one per token without it.

    The first event carries the prefill token, so every verify step comes after it; SGLang
    reports spec_verify_ct only on the last event (a first event that had one would be
    subtracted, for servers that report it earlier)."""
    if last_meta.get("spec_verify_ct") is not None:
        return int(last_meta["spec_verify_ct"]) - int(first_meta.get("spec_verify_ct") or 0)
    return int(last_meta.get("completion_tokens") or 0) - int(
        first_meta.get("completion_tokens") or 0
    )


def accepted_tokens_per_step(completion_tokens: int, verify_steps) -> float | None:
    """Tokens each verify step added: (completion tokens - 1) / verify steps, the prefill
    token left out. SGLang's spec_accept_length divides all completion tokens, the prefill
    token included, by the verify steps. None without verify steps."""
    if not verify_steps or verify_steps <= 0 or completion_tokens < 1:
        return None
    return (completion_tokens - 1) / verify_steps


def _weighted(records: list[dict], field: str) -> float | None:
    """Mean of a per-request field weighted by each request's output tokens."""
    pairs = [(r["output_tokens"], r.get(field)) for r in records if r.get(field) is not None]
    weight = sum(tokens for tokens, _ in pairs)
    return round(sum(t * v for t, v in pairs) / weight, 4) if weight else None


def summarize_level(requests: list[dict], duration_s: float, itl_ms: list[float]) -> dict:
    """The contract's `summary` of one concurrency level from its request records."""
    ok = [r for r in requests if r["ok"]]
    tokens = sum(r["output_tokens"] for r in ok)
    verify = [r for r in ok if r.get("spec_verify_ct")]
    steps = sum(r.get("decode_steps") or 0 for r in ok)
    decode_ms = sum(r.get("decode_ms") or 0.0 for r in ok)
    latency = sum(r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None) / 1000.0
    return {
        "output_tokens_per_s": round(tokens / duration_s, 3) if duration_s > 0 else None,
        "requests_per_s": round(len(ok) / duration_s, 4) if duration_s > 0 else None,
        "ttft_ms": distribution([r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]),
        "itl_ms": distribution(itl_ms),
        "tpot_ms": distribution([r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]),
        "e2e_ms": distribution([r["e2e_ms"] for r in ok if r.get("e2e_ms") is not None]),
        # Per-request accept lengths (tokens per verify step, the prefill token left out)
        # weighted by the tokens each request produced, so a short answer does not count as
        # much as a long one. 1.0 without speculation.
        "accept_length_mean": (
            _weighted(verify, "accept_length") if verify else (1.0 if ok else None)
        ),
        # SGLang's own per-request spec_accept_length (prefill token included), weighted the
        # same way, for comparison. None without speculation.
        "spec_accept_length_mean": _weighted(verify, "spec_accept_length"),
        # The decomposition tok/s = accepted tokens per step / step time, per request: the
        # tokens the verify steps added over the verify steps, summed over requests.
        "step_ms": round(decode_ms / steps, 4) if steps else None,
        "accepted_tokens_per_step": (
            round(
                sum(r["output_tokens"] - 1 for r in verify)
                / sum(r["spec_verify_ct"] for r in verify),
                4,
            )
            if verify
            else (1.0 if ok else None)
        ),
        "requests_ok": len(ok),
        "requests_failed": len(requests) - len(ok),
        "output_tokens": tokens,
        "duration_s": round(duration_s, 4),
        # Mean requests in flight (Little's law): below the level when the server or the
        # prompts could not keep it busy.
        "effective_concurrency": round(latency / duration_s, 3) if duration_s > 0 else None,
    }


def parse_metrics(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sums of Prometheus samples by metric name over all label sets."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in names:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def startup_record(info: dict):
    """What identifies one start of the server in its /server_info: `startup_time`.

    In SGLang 0.5.23 that is not a timestamp but the durations measured while starting
    (python/sglang/srt/observability/startup_time.py build_engine_startup_time: load_weight,
    kv_cache_allocation, scheduler_e2e, cuda_graph per phase, tokenizer_e2e, in seconds), set
    once by TokenizerManager.set_startup_time; a restarted server measures new ones, equal
    to the old to the last bit only by accident. A number (older releases) is kept as it is.
    Anything else, or a record too large to be that, gives None.
    """
    value = info.get("startup_time") if isinstance(info, dict) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if not isinstance(value, dict) or len(value) > 32:
        return None
    record = {}
    for key, item in value.items():
        if isinstance(item, dict) and len(item) <= 32:
            item = {
                str(k): v
                for k, v in item.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        elif not isinstance(item, (int, float)) or isinstance(item, bool):
            continue
        record[str(key)[:64]] = item
    return record or None


def server_delta(before: dict, after: dict) -> dict:
    """Server counters over one level: /metrics differences, and whether the server restarted
    in between (another startup record in /server_info, or a counter that went down).

    From the counters: SGLang's accept length (generation tokens / verify calls, each
    request's prefill token included) and accepted tokens per step (the same without one
    prefill token per finished request), server-side views of the client's figures."""
    delta = {}
    for name, value in after.get("metrics", {}).items():
        if name in before.get("metrics", {}):
            delta[name] = value - before["metrics"][name]
    restarted = any(value < 0 for value in delta.values())
    if before.get("startup_time") is not None and after.get("startup_time") is not None:
        restarted = restarted or before["startup_time"] != after["startup_time"]
    tokens = delta.get("sglang:generation_tokens_total")
    steps = delta.get("sglang:spec_verify_calls_total")
    finished = delta.get("sglang:num_requests_total")
    counted = not restarted and bool(tokens) and bool(steps) and steps > 0
    return {
        "metrics": delta,
        "spec_accept_length": round(tokens / steps, 4) if counted else None,
        "accepted_tokens_per_step": (
            round((tokens - finished) / steps, 4) if counted and finished is not None else None
        ),
        "restarted": restarted,
    }


def output_tokens_of(record: dict) -> list:
    """What to compare token for token: the server's output ids, else whitespace words."""
    ids = record.get("output_ids")
    if ids:
        return list(ids)
    return (record.get("text") or "").split()


def compare_outputs(reference: list[dict], candidate: list[dict]) -> dict:
    """Token-for-token comparison of two runs on the same prompts, request by request.

    Tokens after the first divergence count as mismatched (they were produced from a
    different prefix); a request that is only longer or shorter diverges where the shorter
    one ends. mismatch_rate = mismatched tokens / compared tokens.
    """
    by_index = {r["index"]: r for r in reference if r.get("ok")}
    compared = mismatched = requests = diverged = 0
    first: list[int] = []
    for record in candidate:
        base = by_index.get(record.get("index"))
        if not record.get("ok") or base is None:
            continue
        if record.get("prompt_sha256") != base.get("prompt_sha256"):
            continue
        if record.get("outputs_incomplete") or base.get("outputs_incomplete"):
            continue  # the server streamed increments: no whole output was kept
        a, b = output_tokens_of(base), output_tokens_of(record)
        length = max(len(a), len(b))
        common = 0
        for left, right in zip(a, b):  # noqa: B905 - stops at the shorter on purpose
            if left != right:
                break
            common += 1
        requests += 1
        compared += length
        mismatched += length - common
        if common < length:
            diverged += 1
            first.append(common)
    return {
        "requests_compared": requests,
        "requests_mismatched": diverged,
        "tokens_compared": compared,
        "tokens_mismatched": mismatched,
        "mismatch_rate": round(mismatched / compared, 6) if compared else None,
        "request_mismatch_rate": round(diverged / requests, 6) if requests else None,
        "first_divergence": sorted(first)[:64],
    }


def special_tokens(config: dict) -> dict:
    """bos_token and friends from a tokenizer_config.json, as the template sees them."""
    found = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    return found


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def template_files(folder: str) -> dict[str, str]:
    """The model folder's files chat_template_of reads, {name: text}, those that can be read."""
    files = {}
    for name in TEMPLATE_FILES:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                files[name] = handle.read()
        except OSError:
            pass
    return files


def chat_template_of(files: dict) -> tuple[str | None, str]:
    """The chat template and where it came from, given the model folder's files
    {name: text}: chat_template.jinja, chat_template.json, then tokenizer_config.json's
    chat_template (a string, or a list of named templates of which `default` is used)."""
    if files.get("chat_template.jinja"):
        return files["chat_template.jinja"], "chat_template.jinja"
    for name in ("chat_template.json", "tokenizer_config.json"):
        if not files.get(name):
            continue
        template = json.loads(files[name]).get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template, name
    return None, ""


def render_chat(template: str, messages: list[dict], tokens: dict, kwargs: dict) -> str:
    """Render messages through a Hugging Face chat template as transformers does: a sandboxed
    jinja2 environment with trim_blocks, lstrip_blocks, loop controls, a tojson that keeps
    non-ASCII, raise_exception and strftime_now, and the generation prompt appended."""
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    class Generation(jinja2.ext.Extension):
        # {% generation %} marks assistant text for training masks; rendering ignores it.
        tags = {"generation"}  # noqa: RUF012 - jinja2's own API

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Generation, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    values = {**tokens, "add_generation_prompt": True, **kwargs, "messages": messages}
    return environment.from_string(template).render(**values)


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?\}")


def fill(template: str, row: dict) -> str:
    """`template` with each {field} or {field[i]} replaced by the row's value; other braces
    (a LaTeX \\boxed{}) stay as they are, and no doubled braces clash with Jinja."""

    def value(match):
        item = row[match.group(1)]
        if match.group(2) is not None:
            item = item[int(match.group(2))]
        return str(item)

    return _FIELD.sub(value, template)


def prompt_of(row: dict, template: str) -> list[dict]:
    """The chat messages of one dataset row: `template` over the row's fields (such as
    "{question}" or "{turns[0]}") as the user's message."""
    return [{"role": "user", "content": fill(template, row)}]
