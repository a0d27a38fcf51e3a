"""How true are the benchmark client's numbers? Measured against the simulator, whose own
timestamps are the truth, side by side with SGLang's own benchmark client.

    .venv/bin/python -m tests.benchmarks.client_fidelity [--sglang-venv DIR] [--out DIR]

The simulator (tests/support/sglang_sim.py, SGLang 0.5.23's stream shape: the first event carries
the prefill token, each later one a verify step's tokens, chunked as uvicorn sends it) runs a
speculative config with a known prefill time, step time and accepted tokens per step, and
(SGLANG_SIM_TRUTH_DIR) records when each request's first bytes were read and when each event
and [DONE] were written. Several simulator processes can share the port (--servers), so that
a burst of connections is read at once and the server side's own queue stays out of the
figures. Every client is compared with the same truth, so what it adds (connecting, its event
loop, its own definitions) is its error.

What each figure means, per request ("started" is when the client began the request):

- TTFT. Truth: first event written - request read. Kit: first event read - connection made
  (connecting is kept apart, connect_ms). SGLang's client: first event with text read -
  started (connecting included).
- ITL. Kit and SGLang's client alike: the gap between two events over the tokens the later
  one carries, for each token. Truth: decode time over the tokens after the first event.
- TPOT. Truth: (last event written - first event written) / tokens after the first event.
  Kit: the same from the times it read them. SGLang's client: (end of stream - first event)
  / (output tokens - 1).
- E2E. Truth: [DONE] written - request read. Kit: [DONE] read - connection made. SGLang's
  client: end of stream - started.
- Output tokens/s. Truth: tokens / (last [DONE] written - first request read). Kit: tokens /
  (last [DONE] read - start of the level). SGLang's client: tokens / the run's wall time
  (starting its tasks included).

SGLang's client is python/sglang/benchmark/serving.py (async_request_sglang_generate,
calculate_metrics; python/sglang/bench_serving.py is its deprecated alias), run as
`python -m sglang.benchmark.serving --backend sglang` against native /generate. Its TPOT
divides by output tokens - 1, which is right only because the first event carries exactly
one token (prefill); it counts the time from the last token to the end of the stream.

1. The kit's client - module_utils/benchmark/client.py's own measuring functions, without
   Ansible - at each level of --levels. Its TTFT difference is split, on the clock all
   processes share, into the time before the server read the request (send) and after it
   wrote the first event (receive: the client's reading and stamping).
2. SGLang's own client from a venv with the pinned sglang wheel and transformers
   (--sglang-venv; skipped when it has no python), on a ShareGPT-format file of the same
   prompts and a word-level tokenizer made for the simulator's tokens.
3. An event-rate sweep: shorter steps at high concurrency (events come in bursts, one per
   running request per step) until the kit's client marks itself saturated; the highest
   event rate it handled unsaturated is reported.

Targets: tokens/s and mean TPOT within 1% of the truth, mean TTFT within 1 ms, at
concurrency 1 to 64. The simulator is Python too: on a small machine it, the client and
anything else running share the cores, which shows as event-loop lag in both.
--out DIR writes client-fidelity.json (every figure, the definitions, the settings) and
client-fidelity.csv (one row per client and level, and per sweep point).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.sim_process import BASE, DFLASH

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
vocab = {"[UNK]": 0, **{f"t{i}": i for i in range(1, 4096)}}
tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer.decoder = decoders.WordPiece(prefix="##")
tokenizer.save(sys.argv[1] + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
           "model_max_length": 1 << 20}, open(sys.argv[1] + "/tokenizer_config.json", "w"))
json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
          open(sys.argv[1] + "/config.json", "w"))
"""


def load_client(folder: Path | None = None):
    """The kit's client (module_utils/benchmark/client.py, client_target.py, client_report.py
    and the level summary of module_utils/benchmark/stats.py), imported as Ansible ships
    them to a host. The client needs only the standard library; module_utils/__init__.py
    gives ansible.module_utils stand-ins where Ansible is not installed (a bare GPU machine).
    `folder`: another copy of module_utils (an earlier commit's, to measure before and after
    a change), loaded in place of this one."""
    import importlib
    import importlib.util
    import types

    folder = Path(folder or REPO / "module_utils")
    spec = importlib.util.spec_from_file_location(
        "module_utils", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    kit = importlib.util.module_from_spec(spec)
    sys.modules["module_utils"] = kit
    spec.loader.exec_module(kit)
    client = importlib.import_module("ansible.module_utils.benchmark.client")
    level = importlib.import_module("ansible.module_utils.benchmark.stats")
    # Target and the client's report are modules of their own; an earlier commit's copy may
    # still have them in client.py.
    parts = [client]
    for name in ("client_target", "client_report"):
        with contextlib.suppress(ModuleNotFoundError):
            parts.append(importlib.import_module(f"ansible.module_utils.benchmark.{name}"))

    def kit(name: str):
        return next(getattr(part, name) for part in reversed(parts) if hasattr(part, name))

    return types.SimpleNamespace(
        Target=kit("Target"),
        run_level=client.run_level,
        record_of=kit("record_of"),
        client_report=kit("client_report"),
        summarize_level=level.summarize_level,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Simulator:
    """One simulator process, or several sharing one port (SO_REUSEPORT) so that the server
    side can outrun the client in the event-rate sweep. Each appends a record per finished
    request to its own file in truth_dir."""

    def __init__(self, model_dir, step_ms, accept, prefill_ms, truth_dir: Path, processes=1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.truth_dir = truth_dir
        truth_dir.mkdir(parents=True, exist_ok=True)
        for old in truth_dir.glob("*.jsonl"):
            old.unlink()
        argv = [*BASE, *DFLASH]
        argv[argv.index("--model-path") + 1] = str(model_dir)
        env = {
            "PATH": "/usr/bin:/bin",
            "SGLANG_SIM_STEP_MS": str(step_ms),
            "SGLANG_SIM_ACCEPT": str(accept),
            "SGLANG_SIM_PREFILL_MS": str(prefill_ms),
            "SGLANG_SIM_TRUTH": "1",
            "SGLANG_SIM_TRUTH_DIR": str(truth_dir),
            "SGLANG_SIM_REUSE_PORT": "1" if processes > 1 else "",
        }
        command = [
            sys.executable,
            str(REPO / "tests/support/sglang_sim.py"),
            *argv,
            "--port",
            str(self.port),
        ]
        self.processes = [
            subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(processes)
        ]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # SGLang's /health_generate answers 200 once the warmup request has generated,
            # and takes a second or more: it generates a token itself.
            with contextlib.suppress(OSError):
                url = self.url + "/health_generate"
                urllib.request.urlopen(url, timeout=30)  # noqa: S310 - loopback
                # The others bound as quickly; their warmup ends within two seconds.
                time.sleep(2.0 if processes > 1 else 0)
                return
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(process.stderr.read().decode())
            time.sleep(0.1)
        raise RuntimeError("the simulator did not become healthy within 60 s")

    def records(self, since: float, skip: int = 0) -> list[dict]:
        """Server-side records of the requests that arrived after `since` (a perf_counter time:
        the same monotonic clock in every process), the first `skip` (warmup) left out."""
        time.sleep(0.3)  # records are appended right after [DONE] is written
        found = []
        for path in self.truth_dir.glob("*.jsonl"):
            found += [json.loads(line) for line in path.read_text().splitlines() if line]
        found = sorted((r for r in found if r["arrival"] >= since), key=lambda r: r["arrival"])
        return [r for r in found[skip:] if r["events"] and r["done"]]

    def truth(self, since: float, skip: int = 0) -> dict:
        return truth_of(self.records(since, skip))

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def truth_of(records: list[dict]) -> dict:
    tokens = sum(r["events"][-1][1] for r in records)
    span = max(r["done"] for r in records) - min(r["arrival"] for r in records)
    tpot = [
        (r["events"][-1][0] - r["events"][0][0]) * 1000 / (r["events"][-1][1] - r["events"][0][1])
        for r in records
        if r["events"][-1][1] > r["events"][0][1]
    ]
    decode_s = sum(r["events"][-1][0] - r["events"][0][0] for r in records)
    later = sum(r["events"][-1][1] - r["events"][0][1] for r in records)
    return {
        "requests": len(records),
        "output_tokens_per_s": tokens / span,
        "tpot_ms": statistics.fmean(tpot),
        # Every token after the first, its share of the gap it came in: the mean ITL.
        "itl_ms": decode_s * 1000 / later if later else None,
        "ttft_ms": statistics.fmean((r["events"][0][0] - r["arrival"]) * 1000 for r in records),
        "e2e_ms": statistics.fmean((r["done"] - r["arrival"]) * 1000 for r in records),
        "events_per_s": sum(len(r["events"]) for r in records) / span,
    }


def prompts(count: int) -> list[str]:
    return [
        " ".join(f"t{(i * 7 + j) % 4000 + 1}" for j in range(16)) + f" q{i}" for i in range(count)
    ]


def figures(summary: dict, meta: dict) -> dict:
    return {
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "tpot_ms": summary["tpot_ms"]["mean"],
        "itl_ms": summary["itl_ms"]["mean"],
        "ttft_ms": summary["ttft_ms"]["mean"],
        "e2e_ms": summary["e2e_ms"]["mean"],
        "failed": summary["requests_failed"],
        "saturated": meta["saturated"],
        "timing_reliable": meta["timing_reliable"],
        "cpu_fraction": meta["cpu_fraction"],
        "lag_p99_ms": meta["loop_lag_ms"]["p99"],
        "events_per_s": meta["events_per_s"],
        # Event loops (processes) the level was spread over; 1 for a client that has one.
        "processes": meta.get("processes", 1),
    }


def run_kit_bare(
    client, sim: Simulator, concurrency: int, requests: int, tokens: int, processes=None
):
    """The module's own measuring functions (run_level, record_of, summarize_level,
    client_report). Its run() adds /flush_cache, /server_info and /metrics calls between
    levels, which several simulator processes behind one port would answer at random."""
    import asyncio
    import gc
    import hashlib

    target = client.Target(sim.url, "")
    texts = prompts(requests)
    body = {"max_new_tokens": tokens, "temperature": 0.0}
    payloads = [target.request({"text": t, "sampling_params": body, "stream": True}) for t in texts]
    # An earlier client has no `processes`; by default the client chooses.
    spread = {"processes": processes} if processes else {}
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(client.run_level(target, payloads[:2], 2, 600.0, tokens + 16))
        since = time.perf_counter()
        gc.collect()
        gc.disable()
        try:
            level = loop.run_until_complete(
                client.run_level(target, payloads, concurrency, 600.0, tokens + 16, **spread)
            )
        finally:
            gc.enable()
    finally:
        loop.close()
    records, itl, sent = [], [], {}
    for tracker, text in zip(level["trackers"], texts, strict=True):
        sha = hashlib.sha256(text.encode()).hexdigest()
        record, gaps = client.record_of(tracker, {}, sha)
        records.append(record)
        itl += gaps
        if tracker.connected and tracker.events:
            sent[sha] = (tracker.connected, tracker.events[0][0])
    summary = client.summarize_level(records, level["ended"] - level["started"], itl)
    events = sum(len(t.events) for t in level["trackers"])
    ours = figures(summary, client.client_report(level, events))
    # Where TTFT's difference from the truth comes from, on the clock all processes share:
    # before the server read the request (its accept queue), and after it wrote the first
    # event (the client's reading and stamping).
    truth_records = sim.records(since)
    joined = [(sent[r["prompt_sha256"]], r) for r in truth_records if r["prompt_sha256"] in sent]
    ours["send_delay_ms"] = statistics.fmean((r["arrival"] - s[0]) * 1000 for s, r in joined)
    ours["receive_delay_ms"] = statistics.fmean(
        (s[1] - r["events"][0][0]) * 1000 for s, r in joined
    )
    return ours, truth_of(truth_records)


def run_sglang(venv: Path, sim: Simulator, concurrency: int, requests: int, tokens: int, work):
    data = work / "sharegpt.json"
    data.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "t1"}]}
                for p in prompts(requests)
            ]
        )
    )
    output = work / f"sglang-c{concurrency}.jsonl"
    output.unlink(missing_ok=True)
    since = time.perf_counter()
    command = [
        str(venv / "bin/python"),
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "sglang",
        "--base-url",
        sim.url,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(data),
        "--sharegpt-output-len",
        str(tokens),
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(concurrency),
        "--tokenizer",
        str(work / "tokenizer"),
        "--model",
        str(work / "tokenizer"),
        "--ready-check-timeout-sec",
        "0",
        "--warmup-requests",
        "1",
        "--output-file",
        str(output),
        "--disable-tqdm",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=work, timeout=1800)
    if done.returncode != 0 or not output.is_file():
        raise RuntimeError(
            f"sglang.benchmark.serving failed: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    result = json.loads(output.read_text().splitlines()[-1])
    return {
        "output_tokens_per_s": result["output_throughput"],
        "tpot_ms": result["mean_tpot_ms"],
        "itl_ms": result["mean_itl_ms"],
        "ttft_ms": result["mean_ttft_ms"],
        "e2e_ms": result["mean_e2e_latency_ms"],
        "failed": requests - result["completed"],
    }, sim.truth(since, skip=1)


def errors(measured: dict, truth: dict) -> dict:
    return {
        "tok_s_err_pct": 100 * (measured["output_tokens_per_s"] / truth["output_tokens_per_s"] - 1),
        "tpot_err_pct": 100 * (measured["tpot_ms"] / truth["tpot_ms"] - 1),
        "itl_err_pct": 100 * (measured["itl_ms"] / truth["itl_ms"] - 1),
        "ttft_err_ms": measured["ttft_ms"] - truth["ttft_ms"],
        "e2e_err_ms": measured["e2e_ms"] - truth["e2e_ms"],
    }


DEFINITIONS = {
    "ttft_ms": {
        "truth": "first event written - request read (server side)",
        "kit": "first event read - connection made; connecting is kept apart as connect_ms",
        "sglang": "first event with text read - request started (connecting included)",
    },
    "itl_ms": {
        "truth": "decode time / tokens after the first event (token-weighted mean)",
        "kit": "gap between two events / tokens the later one carries, per token",
        "sglang": "gap between two events / new tokens, per token (backend sglang)",
    },
    "tpot_ms": {
        "truth": "(last event - first event) / tokens after the first event, per request",
        "kit": "(last event read - first event read) / tokens after the first event",
        "sglang": "(stream end - first event) / (output tokens - 1)",
    },
    "e2e_ms": {
        "truth": "[DONE] written - request read",
        "kit": "[DONE] read - connection made",
        "sglang": "stream end - request started",
    },
    "output_tokens_per_s": {
        "truth": "tokens / (last [DONE] written - first request read)",
        "kit": "tokens / (last [DONE] read - level start)",
        "sglang": "tokens / the run's wall time (starting its tasks included)",
    },
}
CSV_FIELDS = (
    "part",
    "client",
    "concurrency",
    "step_ms",
    "requests",
    "truth_output_tokens_per_s",
    "output_tokens_per_s",
    "tok_s_err_pct",
    "truth_tpot_ms",
    "tpot_ms",
    "tpot_err_pct",
    "truth_itl_ms",
    "itl_ms",
    "itl_err_pct",
    "truth_ttft_ms",
    "ttft_ms",
    "ttft_err_ms",
    "truth_e2e_ms",
    "e2e_ms",
    "e2e_err_ms",
    "saturated",
    "events_per_s",
    "cpu_fraction",
    "lag_p99_ms",
    "processes",
)


def csv_row(part: str, client: str, point: dict, measured: dict, truth: dict) -> dict:
    row = {
        "part": part,
        "client": client,
        "concurrency": point["concurrency"],
        "step_ms": point.get("step_ms"),
        "requests": truth["requests"],
    }
    for name in ("output_tokens_per_s", "tpot_ms", "itl_ms", "ttft_ms", "e2e_ms"):
        row[f"truth_{name}"] = truth[name]
        row[name] = measured[name]
    for name in ("tok_s_err_pct", "tpot_err_pct", "itl_err_pct", "ttft_err_ms", "e2e_err_ms"):
        row[name] = measured[name]
    for name in ("saturated", "events_per_s", "cpu_fraction", "lag_p99_ms", "processes"):
        row[name] = measured.get(name)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def write_outputs(folder: Path, rows: list[dict], sweep: list[dict], args) -> None:
    import csv
    import platform

    folder.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings.pop("sglang_venv", None)
    settings.pop("out", None)
    document = {
        "definitions": DEFINITIONS,
        "settings": settings,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "system": " ".join(
                (platform.system(), platform.release().split("-")[0], platform.machine())
            ),
        },
        "levels": rows,
        "sweep": sweep,
    }
    (folder / "client-fidelity.json").write_text(json.dumps(document, indent=1) + "\n")
    with open(folder / "client-fidelity.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow(csv_row("levels", "kit", row, row["kit"], row["truth"]))
            if "sglang" in row:
                theirs = row["sglang"]
                writer.writerow(csv_row("levels", "sglang", row, theirs, theirs["truth"]))
        for point in sweep:
            writer.writerow(csv_row("sweep", "kit", point, point["kit"], point["truth"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,4,16,64,256,512")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--accept", type=float, default=3.0)
    parser.add_argument("--prefill-ms", type=float, default=30.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--waves", type=int, default=2, help="requests per level / concurrency")
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument(
        "--sglang-venv",
        type=Path,
        default=REPO / "tests" / ".state" / "sglang-client-venv",
        help="a venv with the pinned sglang wheel and transformers (for its benchmark "
        "client); skipped when it has no python",
    )
    parser.add_argument(
        "--sweep",
        default="256x80,256x60,256x40,256x30,256x20,64x10,64x5,64x2.5,64x1.25",
        help="points of the event-rate sweep, CONCURRENCYxSTEP_MS, comma-separated",
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=max(1, min(8, (os.cpu_count() or 2) - 2)),
        help="simulator processes sharing the port (one core each), so that the server side's "
        "own accept queue and event writing stay small next to what is measured",
    )
    parser.add_argument(
        "--processes",
        type=int,
        help="event loops (processes) the kit's client spreads a level over; by default its "
        "own choice (module_utils/benchmark/client.py process_count)",
    )
    parser.add_argument(
        "--client-dir",
        type=Path,
        help="measure the client in this copy of module_utils (an earlier commit's, say: "
        "git archive COMMIT module_utils) rather than the repo's",
    )
    parser.add_argument(
        "--out", type=Path, help="write client-fidelity.json and client-fidelity.csv here"
    )
    args = parser.parse_args(argv)

    client = load_client(args.client_dir)
    rows, sweep = [], []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "tokenizer").mkdir()
        have_sglang = (args.sglang_venv / "bin/python").is_file()
        if have_sglang:
            subprocess.run(
                [str(args.sglang_venv / "bin/python"), "-c", TOKENIZER, str(work / "tokenizer")],
                check=True,
                timeout=300,
            )
        model = str(work / "tokenizer")
        sim = Simulator(
            model, args.step_ms, args.accept, args.prefill_ms, work / "truth", args.servers
        )
        try:
            for concurrency in [int(c) for c in args.levels.split(",")]:
                requests = max(args.min_requests, args.waves * concurrency)
                ours, truth = run_kit_bare(
                    client, sim, concurrency, requests, args.max_new_tokens, args.processes
                )
                row = {
                    "concurrency": concurrency,
                    "requests": requests,
                    "truth": truth,
                    "kit": {**ours, **errors(ours, truth)},
                }
                if have_sglang:
                    theirs, truth2 = run_sglang(
                        args.sglang_venv, sim, concurrency, requests, args.max_new_tokens, work
                    )
                    row["sglang"] = {**theirs, **errors(theirs, truth2), "truth": truth2}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            sim.stop()
        for point_text in [p for p in args.sweep.split(",") if p]:
            level_text, step_text = point_text.split("x")
            concurrency, step = int(level_text), float(step_text)
            sim = Simulator(model, step, args.accept, args.prefill_ms, work / "truth", args.servers)
            try:
                ours, truth = run_kit_bare(
                    client, sim, concurrency, 2 * concurrency, args.max_new_tokens, args.processes
                )
            finally:
                sim.stop()
            point = {
                "step_ms": step,
                "concurrency": concurrency,
                "servers": args.servers,
                "truth": truth,
                "kit": {**ours, **errors(ours, truth)},
            }
            sweep.append(point)
            print(json.dumps(point), flush=True)

    print()
    header = (
        "| c | truth tok/s | kit tok/s err | kit TPOT err | kit ITL err "
        "| kit TTFT err (send + receive) | kit E2E err | kit saturated | kit processes |"
    )
    if any("sglang" in r for r in rows):
        header += (
            " sglang tok/s err | sglang TPOT err | sglang ITL err | sglang TTFT err "
            "| sglang E2E err |"
        )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row in rows:
        kit = row["kit"]
        line = (
            f"| {row['concurrency']} | {row['truth']['output_tokens_per_s']:.1f} "
            f"| {kit['tok_s_err_pct']:+.2f}% | {kit['tpot_err_pct']:+.2f}% "
            f"| {kit['itl_err_pct']:+.2f}% "
            f"| {kit['ttft_err_ms']:+.2f} ms ({kit['send_delay_ms']:+.2f} + "
            f"{kit['receive_delay_ms']:+.2f}) | {kit['e2e_err_ms']:+.2f} ms | {kit['saturated']} "
            f"| {kit['processes']} |"
        )
        if "sglang" in row:
            theirs = row["sglang"]
            line += (
                f" {theirs['tok_s_err_pct']:+.2f}% | {theirs['tpot_err_pct']:+.2f}% "
                f"| {theirs['itl_err_pct']:+.2f}% | {theirs['ttft_err_ms']:+.2f} ms "
                f"| {theirs['e2e_err_ms']:+.2f} ms |"
            )
        print(line)
    print()
    print(
        "| step ms | c | server events/s | client events/s | processes | busiest process CPU "
        "| lag p99 ms | saturated | tok/s err | TPOT err | TTFT err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for point in sweep:
        kit = point["kit"]
        print(
            f"| {point['step_ms']} | {point['concurrency']} | {point['truth']['events_per_s']:.0f} "
            f"| {kit['events_per_s']:.0f} | {kit['processes']} | {kit['cpu_fraction']:.0%} "
            f"| {kit['lag_p99_ms']:.2f} "
            f"| {kit['saturated']} | {kit['tok_s_err_pct']:+.2f}% | {kit['tpot_err_pct']:+.2f}% "
            f"| {kit['ttft_err_ms']:+.2f} ms |"
        )
    calm = [p["kit"]["events_per_s"] for p in sweep if not p["kit"]["saturated"]]
    if sweep:
        print(
            f"\nhighest event rate before the client marked itself saturated: "
            f"{max(calm):.0f} events/s"
            if calm
            else "\nsaturated at every swept rate"
        )
    if args.out:
        write_outputs(args.out, rows, sweep, args)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
