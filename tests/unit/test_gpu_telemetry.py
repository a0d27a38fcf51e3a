"""gpu_telemetry: the sampler against the fake nvidia-smi replaying the real H200 capture, against
hostile output and processes, and the summary's arithmetic on known rows."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ansible.module_utils.benchmark import gpu_summary, gpu_telemetry
from ansible.module_utils.benchmark.gpu_telemetry import GpuSampler, parse_row, summarize

from tests.support.modules import marked_processes

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "gpu-hosts"
FAKE = REPO / "tests" / "support" / "fakes" / "nvidia_smi.py"
H200_TELEMETRY = REPO / "docs" / "measurements" / "telemetry-h200.csv"
MODULE = REPO / "module_utils" / "benchmark" / "gpu_telemetry.py"
# How long a test waits for rows the fake prints every 20 ms; a bound, not a measurement.
WAIT_S = 30.0


@pytest.fixture(autouse=True)
def fresh_probe_cache(monkeypatch):
    monkeypatch.setattr(gpu_telemetry, "_reasons_field_cache", {})


@pytest.fixture
def fake_smi(monkeypatch, tmp_path):
    """The fake nvidia-smi on the h200-x2 capture (two GPUs) replaying the real H200 telemetry."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_FAULT_FILE", str(tmp_path / "fault"))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CAPTURE", str(CAPTURES / "h200-x2"))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_TELEMETRY", str(H200_TELEMETRY))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOOP_MAX_S", "120")
    return str(FAKE)


def script(tmp_path: Path, name: str, body: str) -> str:
    """A stand-in nvidia-smi written as a Python script."""
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return str(path)


def wait_for_rows(sampler: GpuSampler, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while sampler.rows_seen() < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sampler.rows_seen() >= count, sampler.rows_seen()


ROW = (
    "2026/12/01 10:00:{sec:06.3f}, {index}, NVIDIA H200, {power}, 700.00, {sm}, 1980, 3201, 60,"
    " {util}, 2163, {reasons}"
)


def row(sec, index=0, power="690.00", sm="1440", util="100", reasons="0x0000000000000004"):
    return parse_row(
        ROW.format(sec=sec, index=index, power=power, sm=sm, util=util, reasons=reasons), 0.0
    )


# --- against the fake replaying the real capture ---------------------------------------------


def test_replayed_h200_capture_shows_the_power_cap_on_every_gpu(fake_smi):
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=fake_smi)
    sampler.start()
    wait_for_rows(sampler, 2 * 40)
    summary = sampler.stop()
    assert sampler.reasons_field == "clocks_event_reasons.active"
    assert summary["source"] == "nvidia-smi" and summary["interval_ms"] == 20
    assert summary["samples"] >= 40
    assert summary["warnings"] == []
    assert [gpu["index"] for gpu in summary["gpus"]] == [0, 1]
    for gpu in summary["gpus"]:
        assert gpu["name"] == "NVIDIA H200"
        assert gpu["power_limit_w"] == 700.0
        assert gpu["sm_clock_max_mhz"] == 1980
        assert gpu["mem_clock_mhz"]["mean"] == 3201
        # The replay starts at the load: its clocks sit far below 1980 MHz.
        assert 1100 <= gpu["sm_clock_mhz"]["mean"] <= 1600
        assert gpu["throttle"]["power_cap"] > 0.9
        assert gpu["throttle"]["thermal"] == 0.0 and gpu["throttle"]["hw_slowdown"] == 0.0
    # The one capture GPU is dealt onto both host GPUs: the sum is twice one GPU's draw.
    one = summary["gpus"][0]["power_w"]["mean"]
    assert summary["power_w_mean"] == pytest.approx(2 * one, rel=0.15)
    assert summary["energy_j"] == pytest.approx(summary["power_w_mean"] * 0.02 * 39, rel=0.5)
    assert {(t["gpu"], t["reason"]) for t in summary["throttled"]} == {
        (0, "power_cap"),
        (1, "power_cap"),
    }
    for entry in summary["throttled"]:
        assert entry["share"] > 0.9
        assert entry["sm_clock_max_mhz"] == 1980
        assert 1100 <= entry["sm_clock_mhz_mean"] <= 1600


def test_auto_mode_finds_nvidia_smi_on_the_path(fake_smi, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(fake_smi)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sampler = GpuSampler(interval_ms=20)
    sampler.start()
    wait_for_rows(sampler, 2)
    summary = sampler.stop()
    assert summary is not None and summary["samples"] >= 1
    assert sampler.reason is None


def test_without_a_telemetry_capture_the_fake_shows_the_idle_gpus_of_its_capture(
    fake_smi, monkeypatch
):
    monkeypatch.delenv("FAKE_NVIDIA_SMI_TELEMETRY")
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=fake_smi)
    sampler.start()
    wait_for_rows(sampler, 2 * 6)
    summary = sampler.stop()
    first = summary["gpus"][0]
    assert first["power_w"]["mean"] == 120.8  # average_power_draw of the -q -x capture
    assert first["sm_clock_mhz"]["mean"] == 435 and first["sm_clock_max_mhz"] == 1980
    assert first["throttle"] == {"power_cap": 0.0, "thermal": 0.0, "hw_slowdown": 0.0}
    assert summary["throttled"] == []


def test_mode_off_and_missing_nvidia_smi_give_none_with_a_reason(tmp_path):
    off = GpuSampler(mode="off")
    off.start()
    assert off.stop() is None and off.reason == "telemetry is off"
    missing = GpuSampler(command=str(tmp_path / "no-such-nvidia-smi"))
    missing.start()
    assert missing.stop() is None
    assert "not found" in missing.reason


def test_capture_command_writes_raw_rows_and_summary(fake_smi, tmp_path):
    csv_path, json_path = tmp_path / "t.csv", tmp_path / "t.json"
    done = subprocess.run(
        [
            *(sys.executable, str(MODULE), "--seconds", "0.5", "--interval-ms", "50"),
            *("--command", fake_smi, "--csv", str(csv_path), "--json", str(json_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = csv_path.read_text().splitlines()
    assert lines[0] == ", ".join(gpu_telemetry.FIELDS)
    assert len(lines) >= 3 and all(parse_row(line, 0.0) for line in lines[1:])
    summary = json.loads(json_path.read_text())
    assert summary["samples"] == (len(lines) - 1) // 2
    assert summary["gpus"][1]["name"] == "NVIDIA H200"


# --- old drivers, hostile output, hostile processes -------------------------------------------


def test_old_driver_gets_the_throttle_reasons_field_name(tmp_path):
    smi = script(
        tmp_path,
        "old-smi",
        """
args = " ".join(sys.argv[1:])
if "clocks_event_reasons" in args:
    print('Field "clocks_event_reasons.active" is not a valid field to query.')
    sys.exit(2)
if "-lms" in args:
    for n in range(100000):
        print(f"2026/12/01 10:00:{n % 60:02d}.000, 0, Old GPU, 250.00, 300.00, 1300, 1410,"
              " 1215, 70, 100, 100, 0x0000000000000004", flush=True)
        time.sleep(0.01)
""",
    )
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=smi)
    sampler.start()
    wait_for_rows(sampler, 6)
    summary = sampler.stop()
    assert sampler.reasons_field == "clocks_throttle_reasons.active"
    assert summary["gpus"][0]["throttle"]["power_cap"] == 1.0
    assert any("clocks_throttle_reasons.active" in w for w in summary["warnings"])


def test_garbage_and_huge_lines_are_dropped_and_counted(tmp_path):
    good = (
        "2026/12/01 10:00:00.000, 0, NVIDIA H200, 690.00, 700.00, 1440, 1980, 3201, 60, 100, 10,"
        " 0x4"
    )
    smi = script(
        tmp_path,
        "noisy-smi",
        f"""
if "-lms" not in sys.argv:
    sys.exit(0)
out = sys.stdout
out.write("garbage, not a row\\n")
out.write("x" * 5_000_000 + "\\n")
out.write("\\x00\\xff binary-ish junk\\n")
out.write("{good}".replace("0x4", "0xZZ") + "\\n")
out.write("2026/12/01 10:00:00.000, 99999, GPU, 1, 1, 1, 1, 1, 1, 1, 1, 0x0\\n")
out.write("{good}".replace("690.00", "inf").replace(", 60,", ", [N/A],") + "\\n")
for n in range(1, 4):
    out.write("{good}".replace("00:00.000", f"00:0{{n}}.000") + "\\n")
out.flush()
time.sleep(600)
""",
    )
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=smi)
    sampler.start()
    wait_for_rows(sampler, 5)
    summary = sampler.stop()
    gpu = summary["gpus"][0]
    # Kept: the row with bad reasons (reasons unknown), the one with inf/[N/A] values, 3 good.
    assert gpu["samples"] == 5
    assert gpu["power_w"]["mean"] == 690.0  # inf is no reading
    assert gpu["temperature_c"]["mean"] == 60.0  # [N/A] is no reading
    assert gpu["throttle"]["power_cap"] == 1.0  # over the 4 rows whose reasons parse
    assert "1 nvidia-smi lines dropped (long)" in summary["warnings"]
    assert "3 nvidia-smi lines dropped (unparsable)" in summary["warnings"]
    assert not any("did not exit" in w for w in summary["warnings"])


def test_rows_past_the_cap_are_counted_not_kept(fake_smi, monkeypatch):
    monkeypatch.setattr(gpu_telemetry, "MAX_ROWS", 10)
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=fake_smi)
    sampler.start()
    deadline = time.monotonic() + WAIT_S
    while not sampler._dropped["over_cap"] and time.monotonic() < deadline:
        time.sleep(0.02)
    summary = sampler.stop()
    assert sum(gpu["samples"] for gpu in summary["gpus"]) == 10
    assert any(w.endswith("dropped (over cap)") for w in summary["warnings"])


def test_nvidia_smi_that_exits_at_once_leaves_an_empty_summary_saying_why(fake_smi, tmp_path):
    (tmp_path / "fault").write_text("no-driver")
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=fake_smi)
    sampler.start()
    deadline = time.monotonic() + WAIT_S
    while sampler._process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    summary = sampler.stop()
    assert summary["samples"] == 0 and summary["gpus"] == [] and summary["throttled"] == []
    assert summary["power_w_mean"] is None and summary["energy_j"] is None
    assert "nvidia-smi exited with status 9 during the level" in summary["warnings"]
    assert any("couldn't communicate with the NVIDIA driver" in w for w in summary["warnings"])
    assert "no GPU samples recorded" in summary["warnings"]


def test_nvidia_smi_that_never_exits_is_killed_whole(fake_smi, tmp_path, monkeypatch):
    marker = f"telemetry-hang-{uuid.uuid4().hex}"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_HANG_MARKER", marker)
    (tmp_path / "fault").write_text("hang")
    # The probe hangs too: it must give up on its own deadline.
    monkeypatch.setattr(gpu_telemetry, "PROBE_TIMEOUT_S", 0.5)
    sampler = GpuSampler(mode="nvidia-smi", interval_ms=20, command=fake_smi)
    try:
        sampler.start()
        deadline = time.monotonic() + WAIT_S
        while len(marked_processes(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        summary = sampler.stop()
        survivors = marked_processes(marker)
    finally:
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"the hung nvidia-smi's processes survived: {survivors}"
    assert summary["samples"] == 0
    assert not any("reader did not finish" in w for w in summary["warnings"])


# --- the summary's arithmetic -----------------------------------------------------------------


def test_committed_h200_summary_is_what_the_code_makes_of_the_committed_rows():
    lines = H200_TELEMETRY.read_text().splitlines()
    rows = [parse_row(line, 0.0) for line in lines[1:]]
    assert all(rows) and len(rows) == 766
    committed = json.loads(H200_TELEMETRY.with_suffix(".json").read_text())
    assert summarize(rows, 200, []) == committed
    assert committed["throttled"][0]["reason"] == "power_cap"
    assert committed["gpus"][0]["power_limit_w"] == 700.0


def test_interval_is_bounded_and_a_bad_one_does_not_raise():
    assert GpuSampler(interval_ms=1).interval_ms == gpu_telemetry.MIN_INTERVAL_MS
    assert GpuSampler(interval_ms=10**9).interval_ms == gpu_telemetry.MAX_INTERVAL_MS
    assert GpuSampler(interval_ms="fast").interval_ms == 200


def test_summary_math_on_known_rows():
    rows = [
        # Two GPUs polled at 0, 1 and 2 s: GPU 0 busy and power-capped, GPU 1 idle.
        row(0.0, 0, power="600.00", sm="1400"),
        row(0.0, 1, power="100.00", sm="345", util="0", reasons="0x0000000000000001"),
        row(1.0, 0, power="700.00", sm="1500"),
        row(1.0, 1, power="100.00", sm="345", util="0", reasons="0x0000000000000001"),
        row(2.0, 0, power="700.00", sm="1440", reasons="0x0000000000000000"),
        row(2.0, 1, power="[N/A]", sm="345", util="0", reasons="0x0000000000000001"),
    ]
    summary = summarize(rows, 1000, [])
    assert summary["duration_s"] == 2.0 and summary["samples"] == 3
    # Polls with every GPU's power: 700 W at 0 s, 800 W at 1 s (the third lacks GPU 1's).
    assert summary["energy_j"] == 750.0
    assert summary["power_w_mean"] == 750.0
    gpu0, gpu1 = summary["gpus"]
    assert gpu0["power_w"] == {"mean": 666.7, "max": 700.0}
    assert gpu0["sm_clock_mhz"] == {"mean": 1447, "min": 1400, "max": 1500}
    assert gpu0["throttle"]["power_cap"] == 0.667
    assert gpu1["power_w"] == {"mean": 100.0, "max": 100.0}
    assert gpu1["throttle"]["power_cap"] == 0.0
    # Three busy samples are fewer than MIN_BUSY_SAMPLES: no verdict yet.
    assert summary["throttled"] == []


def test_throttled_counts_only_busy_samples():
    busy = [row(float(n), reasons="0x0000000000000004" if n < 4 else "0x0") for n in range(6)]
    idle = [row(10.0 + n, util="0", sm="345", reasons="0x0") for n in range(20)]
    summary = summarize(busy + idle, 1000, [])
    # Over all 26 samples the power cap held in 4 (15%); over the 6 busy ones in 4 (67%).
    assert summary["gpus"][0]["throttle"]["power_cap"] == 0.154
    assert summary["throttled"] == [
        {
            "gpu": 0,
            "reason": "power_cap",
            "share": 0.667,
            "busy_samples": 6,
            "sm_clock_mhz_mean": 1440,
            "sm_clock_max_mhz": 1980,
        }
    ]


def test_thermal_and_hardware_slowdown_bits():
    rows = [row(float(n), reasons=hex(0x40 if n % 2 else 0x80)) for n in range(10)]
    summary = summarize(rows, 1000, [])
    assert summary["gpus"][0]["throttle"] == {"power_cap": 0.0, "thermal": 0.5, "hw_slowdown": 0.5}
    assert [t["reason"] for t in summary["throttled"]] == ["thermal", "hw_slowdown"]


def test_values_out_of_range_or_unsupported_are_null():
    parsed = parse_row(
        "2026/12/01 10:00:00.000, 0, NVIDIA H200, [Not Supported], -5, 1e9, nan, 3201, 999,"
        " 101, 12, 0x4",
        0.0,
    )
    assert parsed["power.draw"] is None and parsed["power.limit"] is None
    assert parsed["clocks.sm"] is None and parsed["clocks.max.sm"] is None
    assert parsed["temperature.gpu"] is None and parsed["utilization.gpu"] is None
    assert parsed["clocks.mem"] == 3201.0 and parsed["reasons"] == 4
    assert parse_row("a, b", 0.0) is None
    assert parse_row(ROW.format(sec=0, index=-1, power=1, sm=1, util=1, reasons="0x0"), 0) is None


def test_a_row_without_a_stamp_on_a_host_off_utc_does_not_stretch_the_level(monkeypatch):
    # nvidia-smi stamps in local time; an unreadable stamp falls back to the reading time
    # (time.time(), UTC-based). Read as UTC, the stamps sat an hour off that fallback.
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        base = datetime.datetime(2026, 12, 1, 10, 0, 0)
        lines = [
            f"{(base + datetime.timedelta(seconds=0.2 * n)):%Y/%m/%d %H:%M:%S.%f}, 0, NVIDIA H200,"
            " 600.00, 700.00, 1440, 1980, 3201, 60, 100, 2163, 0x4"
            for n in range(10)
        ]
        lines.append("[N/A], 0, NVIDIA H200, 600.00, 700.00, 1440, 1980, 3201, 60, 100, 2163, 0x4")
        arrival = base.timestamp() + 2.0  # what the reader's clock said for the last line
        rows = [parse_row(line, arrival) for line in lines]
        summary = summarize(rows, 200, [])
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert summary["duration_s"] == pytest.approx(1.8)
    assert summary["energy_j"] == pytest.approx(600.0 * 1.8)
    assert summary["power_w_mean"] == 600.0


def test_a_dropped_row_shortens_its_poll_rather_than_merging_two():
    rows = [row(0.0, 0), row(0.0, 1), row(1.0, 1), row(2.0, 0), row(2.0, 1)]  # GPU 0 lost at 1 s
    grouped = gpu_summary.polls(rows)
    assert [[(r["index"], r["time"] % 60) for r in poll] for poll in grouped] == [
        [(0, 0.0), (1, 0.0)],
        [(1, 1.0)],
        [(0, 2.0), (1, 2.0)],
    ]
    summary = summarize(rows, 1000, [])
    # Only the whole polls, at 0 and 2 s, count for power: 1380 W each.
    assert summary["power_w_mean"] == 1380.0 and summary["energy_j"] == 2760.0
