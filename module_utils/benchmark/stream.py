"""The benchmark's HTTP/SSE stream parser: one streamed /generate answer, read as it arrives.

Standard library only: this runs on GPU hosts under whatever Python they have.

Why a parser of our own: a streamed /generate answer from SGLang is an HTTP/1.1 response
(chunked under uvicorn, close-delimited from simpler servers) whose body is server-sent
events, `data: {json}` lines ending with `data: [DONE]`. Feeding it raw socket reads from
asyncio's Protocol callbacks, and stamping each event with the time of the read that
delivered it, keeps the client's cost per event at a few microseconds.
"""

from __future__ import annotations

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
