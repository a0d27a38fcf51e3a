"""module_utils/host/helpers.py: the helpers every host-side module shares."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
from ansible.module_utils.host import helpers


def test_atomic_write_leaves_the_whole_file_with_its_mode_and_nothing_else(tmp_path):
    path = tmp_path / "deep" / "state.json"
    helpers.atomic_write(str(path), "first", 0o600)
    assert path.read_text() == "first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    helpers.write_json_atomic(str(path), {"a": [1, 2]})
    assert path.read_text() == '{\n "a": [\n  1,\n  2\n ]\n}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("old")

    class Unwritable:
        pass

    with pytest.raises(TypeError):
        helpers.write_json_atomic(str(path), Unwritable())
    helpers_atomic = helpers.atomic_write
    with pytest.raises(TypeError):
        helpers_atomic(str(path), 12345)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_read_json_and_text_answer_none_for_what_cannot_be_read(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"x": 1}')
    bad.write_text("{not json")
    assert helpers.read_json(str(good)) == {"x": 1}
    assert helpers.read_json(str(bad)) is None
    assert helpers.read_json(str(tmp_path / "missing")) is None
    assert helpers.read_text(str(good)) == '{"x": 1}'
    assert helpers.read_text(str(tmp_path)) is None


def test_hashes(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"abc" * 1_000_000)
    import hashlib

    assert helpers.file_sha256(str(path)) == hashlib.sha256(b"abc" * 1_000_000).hexdigest()
    assert helpers.text_sha256("abc") == hashlib.sha256(b"abc").hexdigest()


def test_systemd_is_pid1_the_way_sd_booted_decides(tmp_path):
    assert helpers.systemd_is_pid1(str(tmp_path)) is False
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    assert helpers.systemd_is_pid1(str(tmp_path)) is True


def test_unit_state_reads_systemctl_show_and_names_the_unit_when_it_fails():
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, "LoadState=loaded\nActiveState=active\nNRestarts=2\n", ""

    state = helpers.unit_state(run, "kimi-sglang", ("LoadState", "ActiveState", "NRestarts"))
    assert state == {"LoadState": "loaded", "ActiveState": "active", "NRestarts": "2"}
    assert calls == [["systemctl", "show", "kimi-sglang", "-p", "LoadState,ActiveState,NRestarts"]]
    with pytest.raises(RuntimeError, match="systemctl show kimi-sglang` exited 1: bus down"):
        helpers.unit_state(lambda argv: (1, "", "bus down"), "kimi-sglang", ("LoadState",))


def test_a_process_group_that_ignores_sigterm_is_killed_after_the_grace():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        started = time.monotonic()
        helpers.kill_process_group(child.pid, grace_s=0.5)
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert 0.5 <= time.monotonic() - started < 5
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    # Gone already, or never a group: nothing to do, nothing raised.
    helpers.kill_process_group(child.pid)
    helpers.kill_process_group(0)
    helpers.kill_process_group(1)


def test_pid_alive_counts_a_zombie_as_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while helpers.pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not helpers.pid_alive(child.pid)  # exited, not yet collected
    child.wait()
    assert helpers.pid_alive(os.getpid())
    assert not helpers.pid_alive(None)


def test_secrets_are_masked_with_ansibles_mask_and_only_secrets():
    masked = helpers.mask_secrets(
        {
            "api_key": "sk-1",
            "hf_token": None,
            "HF-TOKEN": "hf_x",
            "Authorization": "Bearer sk-1",
            "launch_command": "x --api-key sk-1",
            "tokenizer_path": "/opt/kimi/weights/model",
            "max_prefill_tokens": 16384,
            "keyboard": "kept",
            "n": [1, {"db_password": "p"}],
        },
        ["sk-1"],
    )
    assert masked == {
        "api_key": "********",
        "hf_token": None,
        "HF-TOKEN": "********",
        "Authorization": "********",
        "launch_command": "x --api-key ********",
        "tokenizer_path": "/opt/kimi/weights/model",
        "max_prefill_tokens": 16384,
        "keyboard": "kept",
        "n": [1, {"db_password": "********"}],
    }
    assert helpers.MASK == "********"


def test_marked_json_reads_the_last_report_line_and_refuses_what_is_not_one():
    marker = "REPORT "
    report = {"ok": True, "values": {"tp_size": 8}}
    first = marker + json.dumps({"ok": False})
    said = f"a warning\n{first}\nmore noise\n{marker}{json.dumps(report)}"
    assert helpers.marked_json(said, marker) == report
    assert helpers.marked_json("nothing marked\n", marker) is None
    assert helpers.marked_json(f"  {marker}{json.dumps(report)}", marker) is None  # not at start
    assert helpers.marked_json(f"{marker}{{cut", marker) is None
    assert helpers.marked_json(f"{marker}[1, 2]", marker) is None
    assert helpers.marked_json(f"{marker}null", marker) is None
    # The last marked line is the report, even when it is broken: no older one stands in.
    assert helpers.marked_json(f"{marker}{json.dumps(report)}\n{marker}{{cut", marker) is None
    big = f"{marker}{json.dumps({'x': 'y' * 100})}"
    assert helpers.marked_json(big, marker, max_chars=200) == {"x": "y" * 100}
    assert helpers.marked_json(big, marker, max_chars=100) is None
    huge = marker + json.dumps({"x": "y" * helpers.MARKED_JSON_MAX_CHARS})
    assert helpers.marked_json(huge, marker) is None
