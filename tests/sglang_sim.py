"""An SGLang server simulator: the endpoints and streaming format of `sglang.launch_server`,
with step time, tokens accepted per step, load time and crashes set from the environment.

Real SGLang cannot run here (no GPU, no weights). The simulator stands in for it in tests of
the server role and the benchmark: it refuses any argv the pinned release's parser refuses
(through the committed parser snapshot), then serves

    GET  /health /health_generate /server_info /get_server_info /metrics
    POST /flush_cache /generate   (streaming: `data: {json}` events, then `data: [DONE]`)

A scheduler advances every running request by one decode step every SGLANG_SIM_STEP_MS; a
step yields 1 token without speculation and SGLANG_SIM_ACCEPT tokens with it, so throughput
and step time are known exactly. Outputs are deterministic per prompt; SGLANG_SIM_LOSSY (a
fraction) changes that share of tokens under speculation, to exercise losslessness checks.

Environment (all optional):
    SGLANG_SIM_STEP_MS        decode step time, ms (default 20)
    SGLANG_SIM_ACCEPT         tokens per verify step under speculation (default 3.0; fractional
                              values alternate between floor and ceil to average out)
    SGLANG_SIM_PREFILL_MS     time to first token after admission, ms (default 50)
    SGLANG_SIM_LOAD_SECONDS   time before /health answers 200 (default 0)
    SGLANG_SIM_CRASH_AFTER    exit(1) after this many generate requests (default: never)
    SGLANG_SIM_CRASH_ON_START exit(1) right after parsing the arguments when "1"
    SGLANG_SIM_LOSSY          fraction of tokens altered under speculation (default 0)
    SGLANG_SIM_MAX_RUNNING    requests decoded together (default 256)
    SGLANG_SIM_TRUTH          "1": record when each request arrived and when each of its events
                              and its [DONE] were written (server-side truth for client
                              fidelity checks): GET /sim_truth, POST /sim_truth/reset
    SGLANG_SIM_TRUTH_DIR      also append each finished request's record to <dir>/<pid>.jsonl
    SGLANG_SIM_REUSE_PORT     "1": listen with SO_REUSEPORT, so several simulators share a port
                              (the kernel spreads connections; a client can outrun one process)

Events carry cumulative `output_ids` (ids derived from the token text, so a token altered by
SGLANG_SIM_LOSSY has another id), /server_info a `startup_time`, and /metrics the counters
SGLang exports (generation and prompt tokens, verify calls, requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "0.5.23"


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


@dataclass
class Settings:
    step_ms: float = field(default_factory=lambda: env_float("SGLANG_SIM_STEP_MS", 20))
    accept: float = field(default_factory=lambda: env_float("SGLANG_SIM_ACCEPT", 3.0))
    prefill_ms: float = field(default_factory=lambda: env_float("SGLANG_SIM_PREFILL_MS", 50))
    load_seconds: float = field(default_factory=lambda: env_float("SGLANG_SIM_LOAD_SECONDS", 0))
    crash_after: float = field(default_factory=lambda: env_float("SGLANG_SIM_CRASH_AFTER", 0))
    lossy: float = field(default_factory=lambda: env_float("SGLANG_SIM_LOSSY", 0))
    max_running: int = field(default_factory=lambda: int(env_float("SGLANG_SIM_MAX_RUNNING", 256)))
    truth: bool = field(default_factory=lambda: os.environ.get("SGLANG_SIM_TRUTH") == "1")
    truth_dir: str = field(default_factory=lambda: os.environ.get("SGLANG_SIM_TRUTH_DIR", ""))
    reuse_port: bool = field(default_factory=lambda: os.environ.get("SGLANG_SIM_REUSE_PORT") == "1")


SNAPSHOT = "sglang-0.5.23-args.json"


def validator_paths() -> tuple[Path, Path]:
    """(folder of sglang_args.py, snapshot file) in the repo, or beside this file once it is
    packaged as a stand-in sglang wheel (tests/fake_sglang.py)."""
    here = Path(__file__).resolve().parent
    if (here / "sglang_args.py").is_file():
        return here, here / SNAPSHOT
    return here.parent / "module_utils", here / "contract" / SNAPSHOT


def merge_config_file(argv: list[str]) -> list[str]:
    """`sglang serve --config FILE.yaml` as prepare_server_args does it: the file's keys become
    flags placed before the command line's own, so the command line wins."""
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    import yaml

    with open(argv[index + 1], encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    merged: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            merged.append(flag)
        elif value is not False and value is not None:
            merged += [flag, str(value)]
    return merged + argv[:index] + argv[index + 2 :]


def parse_args(argv: list[str]) -> dict:
    """Validate against the pinned parser's snapshot; return the few values the simulator uses."""
    module_dir, snapshot_file = validator_paths()
    sys.path.insert(0, str(module_dir))
    from sglang_args import ArgvError, load_snapshot, validate_argv

    snapshot = load_snapshot(snapshot_file)
    try:
        argv = merge_config_file(argv)
    except (OSError, ValueError, IndexError) as error:
        print(f"launch_server: error: --config: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        validate_argv(argv, snapshot)
    except ArgvError as error:
        print(f"launch_server: error: {error}", file=sys.stderr)
        sys.exit(2)
    values: dict = {
        "host": "127.0.0.1",
        "port": 30000,
        "speculative_algorithm": None,
        "api_key": None,
        "model_path": None,
        "num_draft_tokens": None,
    }
    names = {
        "--host": "host",
        "--port": "port",
        "--speculative-algorithm": "speculative_algorithm",
        "--api-key": "api_key",
        "--model-path": "model_path",
        "--speculative-num-draft-tokens": "num_draft_tokens",
    }
    for index, arg in enumerate(argv):
        flag, _, inline = arg.partition("=")
        if flag in names:
            values[names[flag]] = inline or argv[index + 1]
    values["port"] = int(values["port"])
    values["argv"] = argv
    return values


def token(prompt: str, index: int) -> str:
    return "w" + hashlib.blake2b(f"{prompt}\0{index}".encode(), digest_size=4).hexdigest()


VOCAB = 163840  # Kimi K2.6's


def token_id(word: str) -> int:
    return int(hashlib.blake2b(word.encode(), digest_size=4).hexdigest(), 16) % VOCAB


@dataclass
class Request:
    prompt: str
    max_new_tokens: int
    queue: asyncio.Queue
    admitted: float = 0.0
    tokens: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    verify_steps: int = 0
    accepted_carry: float = 0.0
    done: bool = False


class Simulator:
    def __init__(self, args: dict, settings: Settings):
        self.args = args
        self.settings = settings
        self.speculative = args["speculative_algorithm"] is not None
        self.started = time.monotonic()
        self.running: list[Request] = []
        self.waiting: asyncio.Queue[Request] = asyncio.Queue()
        self.generate_count = 0
        self.startup_time = time.time()
        self.prompt_tokens = 0
        self.requests_total = 0
        # Server-side timings when SGLANG_SIM_TRUTH=1: one record per streamed request.
        self.truth: list[dict] = []
        # Cumulative since start, as SGLang's /server_info reports it.
        self.total_tokens = 0
        self.total_steps = 0
        self.wakeup = asyncio.Event()

    @property
    def loaded(self) -> bool:
        return time.monotonic() - self.started >= self.settings.load_seconds

    def tokens_this_step(self, request: Request) -> int:
        if not self.speculative:
            return 1
        request.accepted_carry += self.settings.accept
        count = max(1, math.floor(request.accepted_carry))
        request.accepted_carry -= count
        return count

    def next_token(self, request: Request, index: int) -> str:
        word = token(request.prompt, index)
        if self.speculative and self.settings.lossy:
            # A verification bug: some accepted drafts differ from what AR would produce.
            draw = (
                int(
                    hashlib.blake2b(
                        f"lossy{index}{request.prompt}".encode(), digest_size=2
                    ).hexdigest(),
                    16,
                )
                / 65536
            )
            if draw < self.settings.lossy:
                word = "x" + word[1:]
        return word

    async def scheduler(self) -> None:
        step = self.settings.step_ms / 1000
        deadline = time.monotonic()
        while True:
            while not self.waiting.empty() and len(self.running) < self.settings.max_running:
                request = self.waiting.get_nowait()
                request.admitted = time.monotonic()
                self.running.append(request)
            if not self.running:
                self.wakeup.clear()
                await self.wakeup.wait()
                deadline = time.monotonic()
                continue
            deadline += step
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            for request in list(self.running):
                if now - request.admitted < self.settings.prefill_ms / 1000:
                    continue
                count = min(
                    self.tokens_this_step(request), request.max_new_tokens - len(request.tokens)
                )
                start = len(request.tokens)
                words = [self.next_token(request, start + i) for i in range(count)]
                request.tokens += words
                request.ids += [token_id(word) for word in words]
                request.verify_steps += 1
                self.total_tokens += count
                self.total_steps += 1
                request.done = len(request.tokens) >= request.max_new_tokens
                request.queue.put_nowait(count)
                if request.done:
                    self.running.remove(request)

    def meta_info(self, request: Request, finished: bool) -> dict:
        meta = {
            "id": hashlib.md5(request.prompt.encode(), usedforsecurity=False).hexdigest(),
            "prompt_tokens": len(request.prompt.split()),
            "completion_tokens": len(request.tokens),
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": len(request.tokens)}
            if finished
            else None,
        }
        if self.speculative:
            steps = max(request.verify_steps, 1)
            drafts = int(self.args["num_draft_tokens"] or 4)
            accept_length = len(request.tokens) / steps
            meta.update(
                spec_verify_ct=request.verify_steps,
                spec_accept_length=accept_length,
                spec_accept_rate=max(0.0, accept_length - 1) / max(drafts - 1, 1),
                spec_num_correct_drafts=len(request.tokens) - request.verify_steps,
            )
        return meta

    def server_info(self) -> dict:
        average = self.total_tokens / self.total_steps if self.total_steps else 0.0
        return {
            "version": VERSION,
            "model_path": self.args["model_path"],
            "speculative_algorithm": self.args["speculative_algorithm"],
            "argv": self.args["argv"],
            "startup_time": self.startup_time,
            "tokenizer_path": self.args["model_path"],
            "internal_states": [
                {
                    "avg_spec_accept_length": average if self.speculative else None,
                    "last_gen_throughput": 0.0,
                }
            ],
        }

    def metrics(self) -> str:
        return (
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs {len(self.running)}\n"
            "# TYPE sglang:generation_tokens_total counter\n"
            f"sglang:generation_tokens_total {self.total_tokens}\n"
            "# TYPE sglang:spec_verify_steps_total counter\n"
            f"sglang:spec_verify_steps_total {self.total_steps}\n"
            "# TYPE sglang:spec_verify_calls_total counter\n"
            f'sglang:spec_verify_calls_total{{model_name="sim"}} '
            f"{self.total_steps if self.speculative else 0}\n"
            "# TYPE sglang:prompt_tokens_total counter\n"
            f'sglang:prompt_tokens_total{{model_name="sim"}} {self.prompt_tokens}\n'
            "# TYPE sglang:num_requests_total counter\n"
            f'sglang:num_requests_total{{model_name="sim"}} {self.requests_total}\n'
        )

    async def generate(
        self, body: dict, writer: asyncio.StreamWriter, arrival: float | None = None
    ) -> None:
        self.generate_count += 1
        crash_after = self.settings.crash_after
        if crash_after and self.generate_count > crash_after:
            print("simulated crash", file=sys.stderr, flush=True)
            os._exit(1)
        params = body.get("sampling_params") or {}
        text = body.get("text")
        if text is None and body.get("input_ids") is not None:
            text = " ".join(map(str, body["input_ids"]))
        arrival = arrival or time.perf_counter()
        request = Request(str(text or ""), int(params.get("max_new_tokens", 128)), asyncio.Queue())
        self.requests_total += 1
        self.prompt_tokens += len(request.prompt.split())
        self.waiting.put_nowait(request)
        self.wakeup.set()
        if not body.get("stream"):
            while not request.done:
                await request.queue.get()
            payload = {
                "text": " ".join(request.tokens),
                "output_ids": list(request.ids),
                "meta_info": self.meta_info(request, True),
            }
            await respond(writer, 200, json.dumps(payload).encode(), "application/json")
            return
        truth = None
        if self.settings.truth and len(self.truth) < 1_000_000:
            truth = {
                "arrival": arrival,
                "prompt_sha256": hashlib.sha256(request.prompt.encode()).hexdigest(),
                "events": [],
                "done": None,
            }
            self.truth.append(truth)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
        )
        while True:
            await request.queue.get()
            event = {
                "text": " ".join(request.tokens),
                "output_ids": request.ids,
                "meta_info": self.meta_info(request, request.done),
            }
            writer.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            if truth is not None:
                truth["events"].append((time.perf_counter(), len(request.tokens)))
            await writer.drain()
            if request.done:
                break
        writer.write(b"data: [DONE]\n\n")
        if truth is not None:
            truth["done"] = time.perf_counter()
            if self.settings.truth_dir:
                path = os.path.join(self.settings.truth_dir, f"{os.getpid()}.jsonl")
                with open(path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(truth) + "\n")
        await writer.drain()


class Stamped(asyncio.StreamReader):
    accepted = 0.0


class StampedProtocol(asyncio.StreamReaderProtocol):
    """Notes when the request's first bytes were read: handlers of a burst of connections
    start one after the other, so a request's arrival is taken here, not when its handler
    runs."""

    def __init__(self, reader: Stamped, *args, **kwargs):
        super().__init__(reader, *args, **kwargs)
        self.stamped = reader

    def data_received(self, data: bytes) -> None:
        if not self.stamped.accepted:
            self.stamped.accepted = time.perf_counter()
        super().data_received(data)


async def respond(writer, status: int, body: bytes, content_type: str = "text/plain") -> None:
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}
    writer.write(
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def serve(args: dict, settings: Settings) -> None:
    simulator = Simulator(args, settings)
    scheduler = asyncio.ensure_future(simulator.scheduler())

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers = {
                k.lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
            path = target.split("?", 1)[0]
            # SGLang lets health and metrics through without the key (utils/auth.py).
            open_path = path.startswith(("/health", "/metrics"))
            authorized = headers.get("authorization") == f"Bearer {args['api_key']}"
            if args["api_key"] and not open_path and not authorized:
                await respond(writer, 401, b'{"error": "Unauthorized"}', "application/json")
            elif path == "/health":
                await respond(writer, 200 if simulator.loaded else 503, b"")
            elif path == "/health_generate":
                if not simulator.loaded:
                    await respond(writer, 503, b"")
                else:
                    await respond(writer, 200, b"")
            elif path in ("/server_info", "/get_server_info"):
                payload = json.dumps(simulator.server_info()).encode()
                await respond(writer, 200, payload, "application/json")
            elif path == "/metrics":
                await respond(writer, 200, simulator.metrics().encode())
            elif path == "/flush_cache":
                await respond(writer, 200, b"Cache flushed.\n")
            elif path == "/sim_truth" and simulator.settings.truth:
                payload = json.dumps(simulator.truth).encode()
                await respond(writer, 200, payload, "application/json")
            elif path == "/sim_truth/reset" and simulator.settings.truth:
                simulator.truth = []
                await respond(writer, 200, b"")
            elif path in ("/model_info", "/get_model_info"):
                info = {"model_path": args["model_path"], "tokenizer_path": args["model_path"]}
                await respond(writer, 200, json.dumps(info).encode(), "application/json")
            elif path == "/generate" and method == "POST":
                if not simulator.loaded:
                    await respond(writer, 503, b"")
                else:
                    arrival = getattr(reader, "accepted", 0.0) or None
                    await simulator.generate(json.loads(body or b"{}"), writer, arrival)
            else:
                await respond(writer, 404, b"")
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    loop = asyncio.get_running_loop()

    def accept() -> asyncio.StreamReaderProtocol:
        reader = Stamped(limit=1 << 16)
        return StampedProtocol(reader, handle, loop=loop)

    server = await loop.create_server(
        accept, args["host"], args["port"], backlog=1024, reuse_port=settings.reuse_port or None
    )
    print(f"simulated sglang {VERSION} serving on {args['host']}:{args['port']}", flush=True)
    async with server:
        await server.serve_forever()
    scheduler.cancel()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if os.environ.get("SGLANG_SIM_CRASH_ON_START") == "1":
        print("simulated crash on start", file=sys.stderr)
        return 1
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args, Settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
