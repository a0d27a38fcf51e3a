"""benchmark_debug: the host collector against fake journalctl, dmesg and nvidia-smi on PATH,
with secrets planted in everything it reads; tests/support/secret_scan proves none is left."""

from __future__ import annotations

import base64
import gzip
import json
import os
from pathlib import Path

import pytest
from ansible.module_utils.benchmark.debug import Scrubber, collect, read_capped
from ansible.module_utils.host.helpers import MASK

from tests.support.modules import run_module
from tests.support.secret_scan import derived_forms, scan

pytestmark = pytest.mark.benchmark

API_KEY = "sk-debug-4f9c2a7e1b3d5c8e0a6f"
HF_TOKEN = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm0123456789"
# Nobody lists it: only the hf_ pattern finds it.
STRAY_TOKEN = "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210"
BEARER_B64 = base64.b64encode(f"Bearer {API_KEY}".encode()).decode()


def fake(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host: fake commands first on PATH, a server log, runtime and launch records, all with
    secrets in them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(
        bin_dir,
        "nvidia-smi",
        '[ "$1" = "-q" ] || exit 2\n'
        'echo "==============NVSMI LOG=============="\n'
        'echo "Driver Version : 580.95.05"\n'
        f'echo "Note : {API_KEY}"\n',
    )
    fake(
        bin_dir,
        "dmesg",
        'echo "[  1.0] usb 1-1: new device"\n'
        'echo "[ 99.0] NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus."\n'
        'echo "[ 99.1] NVRM: GPU at PCI:0000:1b:00: GPU-1234"\n'
        f'echo "[100.0] audit: cmd=curl -H Authorization: Bearer {API_KEY}"\n'
        f'echo "[100.1] NVRM: Xid 13 token {HF_TOKEN}"\n',
    )
    calls = tmp_path / "journalctl-args"
    fake(
        bin_dir,
        "journalctl",
        f'echo "$@" > {calls}\n'
        f"echo \"2026-01-01T00:00:01 h kimi-sglang[1]: server_args=ServerArgs(api_key='{API_KEY}', "
        f'tp_size=8)"\n'
        'echo "2026-01-01T00:00:02 h kimi-sglang[1]: h:1:1 [0] NCCL INFO Bootstrap : Using eth0"\n'
        f'echo "2026-01-01T00:00:03+0000 h kimi-sglang[1]: echo {BEARER_B64}"\n',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    log = tmp_path / "sglang.log"
    log.write_text(
        f"server_args=ServerArgs(model_path='/models/k2', api_key='{API_KEY}', tp_size=8)\n"
        "h:1:1 [0] NCCL INFO NCCL version 2.27.3+cuda12.9\n"
        f"h:1:1 [0] NCCL INFO cudaDriverVersion 12080 {HF_TOKEN}\n"
        f"downloading with token {STRAY_TOKEN}\n"
        f"GET /v1/models Authorization: Bearer {API_KEY}\n"
        f"digest {__import__('hashlib').sha256(API_KEY.encode()).hexdigest()}\n"
        "Decode batch. #running-req: 64\n"
    )
    runtime = tmp_path / "runtime.json"
    runtime.write_text(
        json.dumps(
            {
                "packages": [{"name": "sglang", "version": "0.5.23"}],
                "index_url": f"https://user:{HF_TOKEN}@pypi.example/simple",
            }
        )
    )
    launch = tmp_path / "launch.json"
    launch.write_text(
        json.dumps(
            {
                "manager": "supervisor",
                "argv": ["python", "-m", "sglang.launch_server", "--api-key", API_KEY],
                "environment": {"NCCL_DEBUG": "INFO", "HF_TOKEN": HF_TOKEN},
            }
        )
    )
    return {
        "tmp": tmp_path,
        "bin": bin_dir,
        "log": log,
        "runtime": runtime,
        "launch": launch,
        "dest": tmp_path / "run" / "debug" / "ar",
        "journal_args": calls,
    }


def params(host, **over) -> dict:
    base = {
        "phase": "begin",
        "dest": str(host["dest"]),
        "config": "ar",
        "unit_name": "kimi-sglang",
        "manager": "auto",
        "log_file": str(host["log"]),
        "runtime_record": str(host["runtime"]),
        "launch_record": str(host["launch"]),
        "secrets": [API_KEY, HF_TOKEN],
        "max_bytes": 64 << 20,
        "nccl_lines": 2000,
        "command_timeout": 30,
        "timeout": 120,
        "nvidia_smi": "nvidia-smi",
        "journalctl": "journalctl",
        "dmesg": "dmesg",
    }
    return {**base, **over}


def all_phases(host, **over) -> dict:
    """The three phases, with what the log file holds written during the config (the end
    reads only what the server wrote after the begin)."""
    log = host["log"]
    written = log.read_bytes() if log.is_file() and not log.is_symlink() else None
    if written is not None:
        log.write_bytes(b"")
    index = collect(params(host, phase="begin", **over))
    if written is not None:
        log.write_bytes(written)
    for phase in ("start", "end"):
        index = collect(params(host, phase=phase, **over))
    return index


def text_of(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode()


def assert_no_secret(folder: Path) -> None:
    """Every file, gzip ones decompressed beside the copy scanned, holds no form of a secret."""
    plain = folder.parent / (folder.name + "-plain")
    plain.mkdir()
    for path in folder.iterdir():
        (plain / path.name.removesuffix(".gz")).write_text(text_of(path))
    secrets = {
        "api key": derived_forms(API_KEY),
        "hf token": derived_forms(HF_TOKEN),
        "stray token": {"plain": STRAY_TOKEN.encode()},
    }
    leaks, read = scan([plain], secrets, readable_only=False)
    assert read == len(list(folder.iterdir()))
    assert leaks == [], [str(leak) for leak in leaks]


def test_supervised_config_leaves_every_file_scrubbed(host):
    index = all_phases(host)
    dest = host["dest"]
    names = sorted(p.name for p in dest.iterdir())
    assert names == sorted(
        [
            "collected.json",
            "dmesg.txt",
            "launch.json",
            "nccl.txt",
            "nvidia-smi-q-end.txt",
            "nvidia-smi-q-start.txt",
            "runtime.json",
            "server.log.gz",
        ]
    )
    assert index["manager"] == "supervisor"
    assert {f["status"] for f in index["files"].values()} == {"ok"}
    assert index["masked_values"] >= 8
    assert_no_secret(dest)
    log = text_of(dest / "server.log.gz")
    # Whole, secrets masked, the rest as it was.
    assert "api_key='********'" in log
    assert "Decode batch. #running-req: 64" in log
    assert text_of(dest / "nccl.txt").splitlines() == [
        "h:1:1 [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        f"h:1:1 [0] NCCL INFO cudaDriverVersion 12080 {MASK}",
    ]
    dmesg = text_of(dest / "dmesg.txt").splitlines()
    assert dmesg == [
        "[ 99.0] NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.",
        "[ 99.1] NVRM: GPU at PCI:0000:1b:00: GPU-1234",
        f"[100.1] NVRM: Xid 13 token {MASK}",
    ]
    assert "Driver Version : 580.95.05" in text_of(dest / "nvidia-smi-q-start.txt")
    launch = json.loads(text_of(dest / "launch.json"))
    assert launch["argv"][-1] == MASK and launch["environment"]["NCCL_DEBUG"] == "INFO"
    assert launch["environment"]["HF_TOKEN"] == MASK
    runtime = json.loads(text_of(dest / "runtime.json"))
    assert runtime["packages"] == [{"name": "sglang", "version": "0.5.23"}]
    assert runtime["index_url"] == f"https://user:{MASK}@pypi.example/simple"
    window = json.loads((dest / "collected.json").read_text())["window"]
    assert window["since_epoch"] <= window["until_epoch"]


def test_systemd_reads_the_log_file_and_the_units_journal_for_the_window(host):
    """The unit writes the server's output to the log file (the journal would keep the API key
    SGLang logs at start); its journal keeps systemd's lines, read for the window."""
    index = all_phases(host, manager="systemd")
    dest = host["dest"]
    log = text_of(dest / "server.log.gz")
    assert "NCCL INFO NCCL version" in log and f"api_key='{MASK}'" in log
    journal = text_of(dest / "journal.txt.gz")
    assert "NCCL INFO Bootstrap" in journal and f"api_key='{MASK}'" in journal
    args = host["journal_args"].read_text().split()
    window = index["window"]
    assert args[:2] == ["-u", "kimi-sglang"]
    assert f"--since=@{int(window['since_epoch'])}" in args
    assert f"--until=@{int(window['until_epoch']) + 1}" in args
    # The NCCL lines are the server's, from its log file.
    assert "NCCL INFO NCCL version" in text_of(dest / "nccl.txt")
    assert_no_secret(dest)


def test_denied_dmesg_and_missing_commands_are_recorded_not_fatal(host):
    fake(
        host["bin"],
        "dmesg",
        'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\nexit 1\n',
    )
    index = all_phases(
        host, nvidia_smi="no-such-nvidia-smi", journalctl="no-such-journalctl", manager="systemd"
    )
    files = index["files"]
    assert files["dmesg.txt"]["status"] == "denied"
    assert "Operation not permitted" in files["dmesg.txt"]["why"]
    assert "Operation not permitted" in (host["dest"] / "dmesg.txt").read_text()
    assert files["nvidia-smi-q-end.txt"]["status"] == "missing"
    assert "no-such-nvidia-smi is not on" in (host["dest"] / "nvidia-smi-q-end.txt").read_text()
    assert files["journal.txt.gz"]["status"] == "missing"
    # The server's own lines come from its log file, which no missing command hides.
    assert "NCCL INFO NCCL version" in (host["dest"] / "nccl.txt").read_text()


def test_a_hung_command_is_killed_at_its_deadline(host):
    marker = host["tmp"] / "hung-pid"
    fake(host["bin"], "nvidia-smi", f"echo $$ > {marker}\nexec sleep 600\n")
    index = collect(params(host, phase="start", command_timeout=0.5))
    entry = index["files"]["nvidia-smi-q-start.txt"]
    assert entry["status"] == "failed" and "was killed" in entry["why"]
    pid = int(marker.read_text())
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )


def test_a_log_over_the_cap_keeps_its_start_and_end_and_says_so(host):
    lines = [f"line {i:07d} api_key='{API_KEY}'\n" for i in range(20000)]
    host["log"].write_text("".join(lines))
    cap = 64 << 10
    index = all_phases(host, max_bytes=cap)
    entry = index["files"]["server.log.gz"]
    assert entry["status"] == "cut"
    text = text_of(host["dest"] / "server.log.gz")
    assert entry["bytes"] <= cap + 400
    assert text.startswith("line 0000000 ")
    assert text.rstrip().endswith(f"line 0019999 api_key='{MASK}'")
    assert "over the cap of 65536 bytes" in text
    # Cut on line edges: every kept line whole.
    body = [x for x in text.splitlines() if x.startswith("line ")]
    assert all(x.endswith(f"'{MASK}'") for x in body)
    assert_no_secret(host["dest"])


def test_nccl_lines_are_bounded(host):
    host["log"].write_text("".join(f"[0] NCCL INFO ring {i}\n" for i in range(50)))
    all_phases(host, nccl_lines=10)
    lines = (host["dest"] / "nccl.txt").read_text().splitlines()
    assert lines[:10] == [f"[0] NCCL INFO ring {i}" for i in range(10)]
    assert "50 NCCL lines, the first 10 kept" in lines[10]


def test_begin_removes_an_earlier_attempt_and_only_the_collectors_files(host):
    all_phases(host)
    dest = host["dest"]
    (dest / "notes-of-someone.txt").write_text("keep me")
    index = collect(params(host, phase="begin"))
    assert sorted(p.name for p in dest.iterdir()) == ["collected.json", "notes-of-someone.txt"]
    assert index["files"] == {}
    ended = collect(params(host, phase="end"))
    assert ended["files"]["nvidia-smi-q-start.txt"]["status"] == "missing"


def test_a_linked_dest_is_refused(host, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    host["dest"].parent.mkdir(parents=True)
    host["dest"].symlink_to(target)
    with pytest.raises(ValueError, match="is a link"):
        collect(params(host))
    assert list(target.iterdir()) == []


def test_a_log_that_is_no_regular_file_is_missing(host, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        read_capped(str(fifo), 100)
    index = all_phases(host, log_file=str(fifo))
    assert index["files"]["server.log.gz"]["status"] == "missing"
    assert "not a regular file" in index["files"]["server.log.gz"]["why"]
    index = all_phases(host, log_file=str(tmp_path / "nope.log"))
    assert index["files"]["server.log.gz"]["status"] == "missing"


def test_scrubber_patterns_keep_unset_values():
    scrub = Scrubber([])
    assert scrub("api_key=None, tp_size=8") == "api_key=None, tp_size=8"
    assert scrub('{"api_key": ""}') == '{"api_key": ""}'
    assert scrub('{"api_key": "abc"}') == f'{{"api_key": "{MASK}"}}'
    assert scrub("KIMI_SERVER_API_KEY=abc123") == f"KIMI_SERVER_API_KEY={MASK}"
    assert scrub("--api-key abc123 --port 1") == f"--api-key {MASK} --port 1"
    assert scrub.count == 3


def test_module_runs_each_phase_and_rejects_bad_options(host):
    for phase in ("begin", "start", "end"):
        result = run_module("benchmark_debug", params(host, phase=phase))
        assert not result.get("failed"), result.get("msg")
    assert result["files"]["server.log.gz"]["status"] == "ok"
    assert API_KEY not in json.dumps(result)
    bad = run_module("benchmark_debug", params(host, max_bytes=10, dest="relative"))
    assert bad["failed"] and "max_bytes is 10" in bad["msg"] and "absolute" in bad["msg"]
    checked = run_module(
        "benchmark_debug", params(host, phase="begin", dest=str(host["tmp"] / "x")), check_mode=True
    )
    assert checked["changed"] and not (host["tmp"] / "x").exists()


def test_scrubber_finds_patterns_deep_in_one_long_line_and_in_any_case():
    filler = "x" * (1 << 20)
    text = f"{filler} api_key={API_KEY.upper()} {filler} Authorization: Bearer tok.en {STRAY_TOKEN}"
    scrub = Scrubber([API_KEY])
    out = scrub(text)
    assert out == f"{filler} api_key={MASK} {filler} Authorization: Bearer {MASK} {MASK}"
    assert scrub.count == 3


def test_no_match_falls_between_two_windows_at_any_offset():
    """Hardening II (8): an earlier launch's api_key=None opens a window of LOOK_AHEAD
    characters; a later launch's api_key='...' whose value straddled that window's end survived
    whole (the window cut it, and the next search began past it)."""
    from ansible.module_utils.host import secret_scrub

    key = "sk-kimi-unlisted-" + "k" * 40
    first = "api_key=None "
    window_end = len("api_key") + secret_scrub.LOOK_AHEAD
    for start in range(window_end - 80, window_end + 16):
        for assignment in (f"api_key='{key}'", f'"api_key": "{key}"', f"--api-key {key}"):
            text = first + "x" * (start - len(first)) + " " + assignment + " tail"
            scrub = Scrubber([])
            out = scrub(text)
            assert key not in out, (start, assignment)
            assert out.startswith(first) and out.endswith(" tail")


def run_config(host, during, **over) -> str:
    """begin, then `during(log)` (what the config's server wrote), start and end: the text of
    the server.log.gz the config brought back."""
    collect(params(host, phase="begin", **over))
    during(host["log"])
    collect(params(host, phase="start", **over))
    collect(params(host, phase="end", **over))
    return text_of(host["dest"] / "server.log.gz")


def test_a_config_brings_back_only_the_log_lines_written_since_its_begin(host):
    """The log file keeps every launch's lines (each config restarts the server): a config's
    file starts where the log ended at its begin."""

    def appended(log):
        with log.open("a") as handle:
            handle.write("this config's launch: NCCL INFO Bootstrap : Using eth0\n")

    text = run_config(host, appended)
    assert text == "this config's launch: NCCL INFO Bootstrap : Using eth0\n"
    assert "NCCL INFO Bootstrap" in text_of(host["dest"] / "nccl.txt")


@pytest.mark.parametrize("how", ["rotated", "truncated"])
def test_a_rotated_or_truncated_log_is_new_whole(host, how):
    """Rotated away (another file at the path) or cut to less than it was: everything in the
    file is from this config's window."""

    def replaced(log):
        if how == "rotated":
            log.rename(log.with_suffix(".log.1"))
        log.write_text("after rotation\n")

    assert run_config(host, replaced) == "after rotation\n"
