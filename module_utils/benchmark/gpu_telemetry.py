"""GPU telemetry while a benchmark level runs: power, clocks, temperature, load, throttle reasons.

Why nvidia-smi and not NVML through nvidia-ml-py: the hosts have the driver (and so nvidia-smi)
but not nvidia-ml-py, and the host side takes no new dependency. `nvidia-smi --query-gpu ...
-lms N` reads the same NVML counters, one CSV row per GPU every N ms, from one long-lived process,
so sampling costs one fork per level, not one per sample.

Standard library only and no Ansible import: the benchmark imports it as
ansible.module_utils.benchmark.gpu_telemetry, and `python3 module_utils/benchmark/gpu_telemetry.py
--seconds S ...` runs it bare from a checkout on a machine without Ansible
(docs/measurements/run_telemetry_h200.sh): the bootstrap below makes the kit's stages
importable there (module_utils/__init__.py). What a level's samples add up to (its summary.gpu)
is module_utils/benchmark/gpu_summary.py.

Everything nvidia-smi prints is outside input: lines are bounded in length and count, every value
is parsed and range-checked, "[N/A]" / "[Not Supported]" become None, and the process is stopped
within a deadline (terminate, then kill, its whole process group).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Run bare (python3 module_utils/benchmark/gpu_telemetry.py): the kit's stages, as modules see them.
if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import module_utils  # noqa: F401

from ansible.module_utils.benchmark.gpu_summary import summarize

# Newer drivers name the reasons "clocks_event_reasons"; older ones only "clocks_throttle_reasons".
EVENT_REASONS_FIELD = "clocks_event_reasons.active"
LEGACY_REASONS_FIELD = "clocks_throttle_reasons.active"
BASE_FIELDS = (
    "timestamp",
    "index",
    "name",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.max.sm",
    "clocks.mem",
    "temperature.gpu",
    "utilization.gpu",
    "memory.used",
)
FIELDS = (*BASE_FIELDS, EVENT_REASONS_FIELD)

MAX_LINE_BYTES = 2048
# 8 GPUs at 200 ms for 1.5 h; rows past this are counted as dropped, not kept.
MAX_ROWS = 220_000
MAX_GPUS = 64
MAX_GPU_INDEX = 1023
MAX_NAME_CHARS = 96
# Unparsable lines kept (shortened) to explain a sampler that recorded nothing.
MAX_KEPT_ODD_LINES = 3
ODD_LINE_CHARS = 200
PROBE_TIMEOUT_S = 5.0
STOP_TERM_WAIT_S = 3.0
STOP_KILL_WAIT_S = 2.0
READER_JOIN_S = 2.0
MIN_INTERVAL_MS = 20
MAX_INTERVAL_MS = 60_000

# field -> (low, high): values outside are treated as unreadable.
BOUNDS = {
    "power.draw": (0.0, 100_000.0),
    "power.limit": (0.0, 100_000.0),
    "clocks.sm": (0.0, 100_000.0),
    "clocks.max.sm": (0.0, 100_000.0),
    "clocks.mem": (0.0, 100_000.0),
    "temperature.gpu": (-100.0, 300.0),
    "utilization.gpu": (0.0, 100.0),
    "memory.used": (0.0, 1.0e8),
}
NOT_AVAILABLE = ("[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "")
TIMESTAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"

# Probed field name per command, so a benchmark's many levels probe once.
_reasons_field_cache: dict[str, str] = {}


def parse_number(text: str, field: str) -> float | None:
    value = text.strip()
    if value.lower() in NOT_AVAILABLE or len(value) > 32:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    low, high = BOUNDS[field]
    if not math.isfinite(number) or not low <= number <= high:
        return None
    return number


def parse_reasons(text: str) -> int | None:
    value = text.strip().lower()
    if not value.startswith("0x") or len(value) > 18:
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


def parse_timestamp(text: str) -> float | None:
    value = text.strip()
    if len(value) > 40:
        return None
    try:
        moment = datetime.datetime.strptime(value, TIMESTAMP_FORMAT)
    except ValueError:
        return None
    # nvidia-smi stamps in the host's local time, as a naive datetime's timestamp() reads it:
    # comparable with time.time(), which stands in for a row whose stamp is unreadable.
    return moment.timestamp()


def parse_row(line: str, arrival: float) -> dict | None:
    """One CSV row of FIELDS (reasons under either name), or None when it is not one."""
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != len(FIELDS):
        return None
    values = dict(zip(FIELDS, parts, strict=True))
    index_text = values["index"]
    if not index_text.isdigit() or len(index_text) > 4 or int(index_text) > MAX_GPU_INDEX:
        return None
    stamp = parse_timestamp(values["timestamp"])
    row = {
        "time": stamp if stamp is not None else arrival,
        "stamped": stamp is not None,
        "index": int(index_text),
        "name": "".join(ch for ch in values["name"] if ch.isprintable())[:MAX_NAME_CHARS],
        "reasons": parse_reasons(values[EVENT_REASONS_FIELD]),
    }
    for field in BOUNDS:
        row[field] = parse_number(values[field], field)
    return row


def _kill_group(process: subprocess.Popen, term_wait_s: float, kill_wait_s: float) -> bool:
    """SIGTERM to the process group, a deadline, then SIGKILL for whatever is left (a child that
    ignores SIGTERM outlives its leader and would hold the pipe open). True once the leader is
    reaped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=term_wait_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=kill_wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def run_bounded(
    argv: list[str], timeout_s: float, max_bytes: int = 65536
) -> tuple[int, str] | None:
    """(exit status, first max_bytes of stdout+stderr) of a short command, or None when it did not
    finish within timeout_s (its whole process group is then killed)."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    kept = 0
    finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([process.stdout], [], [], left)
            if not ready:
                break
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                finished = True
                break
            if kept < max_bytes:
                chunks.append(chunk[: max_bytes - kept])
                kept += len(chunks[-1])
        if finished:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
                return process.returncode, b"".join(chunks).decode("utf-8", "replace")
        return None
    finally:
        if process.returncode is None:
            _kill_group(process, 0.5, STOP_KILL_WAIT_S)
        process.stdout.close()


def probe_reasons_field(command: str) -> str:
    """The throttle-reasons field name this driver knows (newer name first), probed once."""
    if command in _reasons_field_cache:
        return _reasons_field_cache[command]
    chosen = EVENT_REASONS_FIELD
    try:
        answer = run_bounded(
            [command, f"--query-gpu={EVENT_REASONS_FIELD}", "--format=csv,noheader,nounits"],
            PROBE_TIMEOUT_S,
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        answer = None
    if answer is None:
        # A probe that fails to run says nothing about the name; the sampler reports the cause.
        return chosen
    status, output = answer
    if status != 0 and "not a valid field" in output.lower():
        chosen = LEGACY_REASONS_FIELD
    _reasons_field_cache[command] = chosen
    return chosen


class GpuSampler:
    """Samples every GPU with one `nvidia-smi --query-gpu ... -lms N` process for a level.

    start() never raises; stop() returns the summary dict, or None when the mode is off or no
    nvidia-smi was found (the reason is then in .reason). A sampler that started but saw no
    sample still returns a summary, with samples 0 and the cause in its warnings.
    """

    def __init__(
        self,
        mode: str = "auto",
        interval_ms: int = 200,
        command: str = "nvidia-smi",
        keep_raw: bool = False,
    ) -> None:
        self.mode = mode
        try:
            wanted = int(interval_ms)
        except (TypeError, ValueError, OverflowError):
            wanted = 200  # start() must not raise, and neither should the object it belongs to
        self.interval_ms = min(max(wanted, MIN_INTERVAL_MS), MAX_INTERVAL_MS)
        self.command = command
        self.keep_raw = keep_raw
        self.reason: str | None = None
        self.raw_lines: list[str] = []
        self.reasons_field = EVENT_REASONS_FIELD
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        self._rows: list[dict] = []
        self._indexes: set[int] = set()
        self._warnings: list[str] = []
        self._odd_lines: list[str] = []
        self._dropped = {"long": 0, "unparsable": 0, "over_cap": 0}
        self._started = False

    def argv(self, executable: str) -> list[str]:
        fields = (*BASE_FIELDS, self.reasons_field)
        return [
            executable,
            f"--query-gpu={','.join(fields)}",
            "--format=csv,noheader,nounits",
            "-lms",
            str(self.interval_ms),
        ]

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.mode == "off":
            self.reason = "telemetry is off"
            return
        if self.mode not in ("auto", "nvidia-smi"):
            self.reason = f"unknown telemetry mode {self.mode!r}"
            return
        executable = shutil.which(self.command) if isinstance(self.command, str) else None
        if executable is None:
            self.reason = f"{self.command!s:.200} not found on PATH"
            return
        try:
            self.reasons_field = probe_reasons_field(executable)
            self._process = subprocess.Popen(
                self.argv(executable),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                # Errors ("Field ... is not a valid field", "No devices were found") arrive as
                # odd lines and explain an empty sample; one pipe means no unread pipe can fill.
                stderr=subprocess.STDOUT,
                # Its own process group: stop() must reach children that outlive the leader.
                start_new_session=True,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self._warnings.append(f"nvidia-smi sampler could not start: {exc}")
            self._process = None
            return
        self._reader = threading.Thread(
            target=self._read, args=(self._process.stdout,), name="gpu-telemetry", daemon=True
        )
        self._reader.start()

    def _read(self, stream) -> None:
        try:
            while True:
                line = stream.readline(MAX_LINE_BYTES + 1)
                if not line:
                    return
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    # Skip the rest of an over-long line in bounded reads.
                    while True:
                        rest = stream.readline(MAX_LINE_BYTES + 1)
                        if not rest or rest.endswith(b"\n"):
                            break
                    with self._lock:
                        self._dropped["long"] += 1
                    continue
                self._take(line.decode("utf-8", "replace").rstrip("\r\n"))
        except (OSError, ValueError):
            return

    def _take(self, text: str) -> None:
        if not text.strip():
            return
        row = parse_row(text, time.time())
        with self._lock:
            if row is None:
                self._dropped["unparsable"] += 1
                if len(self._odd_lines) < MAX_KEPT_ODD_LINES:
                    printable = "".join(ch for ch in text if ch.isprintable())
                    self._odd_lines.append(printable[:ODD_LINE_CHARS])
                return
            if row["index"] not in self._indexes and len(self._indexes) >= MAX_GPUS:
                self._dropped["unparsable"] += 1
                return
            self._indexes.add(row["index"])
            if len(self._rows) >= MAX_ROWS:
                self._dropped["over_cap"] += 1
                return
            self._rows.append(row)
            if self.keep_raw:
                self.raw_lines.append(text)

    def _halt(self) -> int | None:
        """Ends the whole process group within the deadlines. Returns the exit status the
        process had before it was asked to stop, if it had one."""
        process = self._process
        exited_alone = process.poll()
        if not _kill_group(process, STOP_TERM_WAIT_S, STOP_KILL_WAIT_S):
            self._warnings.append("nvidia-smi did not exit after SIGKILL; left behind")
        return exited_alone

    def rows_seen(self) -> int:
        """Sample rows kept so far (all GPUs together)."""
        with self._lock:
            return len(self._rows)

    def stop(self) -> dict | None:
        if self._process is None:
            if self.reason is not None:
                return None
            if not self._started:
                self.reason = "sampler was never started"
                return None
            return summarize([], self.interval_ms, self._warnings)
        exited_alone = self._halt()
        if self._reader is not None:
            self._reader.join(READER_JOIN_S)
        if self._reader is not None and self._reader.is_alive():
            # Something outside the group still holds the pipe. Closing it now would block on the
            # reader's buffer lock, so the daemon reader and the pipe are left to end with it.
            self._warnings.append("nvidia-smi output reader did not finish; samples cut off")
        else:
            with contextlib.suppress(OSError, ValueError):
                self._process.stdout.close()
        self._process = None
        with self._lock:
            rows = list(self._rows)
            warnings = list(self._warnings)
            if exited_alone is not None:
                warnings.append(f"nvidia-smi exited with status {exited_alone} during the level")
            for kind, count in self._dropped.items():
                if count:
                    warnings.append(f"{count} nvidia-smi lines dropped ({kind.replace('_', ' ')})")
            if not rows and self._odd_lines:
                warnings.append("nvidia-smi said: " + " | ".join(self._odd_lines))
            if self.reasons_field == LEGACY_REASONS_FIELD:
                warnings.append(f"driver knows only {LEGACY_REASONS_FIELD}; used it")
        if not rows:
            warnings.append("no GPU samples recorded")
        stamped = [row for row in rows if row["stamped"]]
        if rows and len(stamped) != len(rows):
            warnings.append(
                f"{len(rows) - len(stamped)} samples without a readable timestamp; "
                "their arrival time used"
            )
        return summarize(rows, self.interval_ms, warnings)


def main(argv: list[str] | None = None) -> int:
    """Samples for --seconds and writes the raw CSV rows (with a header) and the summary JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--interval-ms", type=int, default=200)
    parser.add_argument("--command", default="nvidia-smi")
    parser.add_argument("--csv", required=True, help="raw rows, header line first")
    parser.add_argument("--json", required=True, help="the summary")
    args = parser.parse_args(argv)
    sampler = GpuSampler(
        mode="nvidia-smi", interval_ms=args.interval_ms, command=args.command, keep_raw=True
    )
    sampler.start()
    deadline = time.monotonic() + max(0.0, args.seconds)
    try:
        while time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    summary = sampler.stop()
    header = ", ".join((*BASE_FIELDS, sampler.reasons_field))
    with open(args.csv, "w", encoding="utf-8") as out:
        out.write(header + "\n")
        for line in sampler.raw_lines:
            out.write(line + "\n")
    document = summary if summary is not None else {"unavailable": sampler.reason}
    with open(args.json, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2, sort_keys=True)
        out.write("\n")
    return 0 if summary is not None and summary["samples"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
