"""The per-host lock over SSH: a second run while the first holds a host fails naming the
holder; after the holder is killed the next run takes over with a warning; a git URL that git
would read as an option is refused by the runtime stage before anything runs git."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ansible_run import controller_bytecode

REPO = Path(__file__).resolve().parents[2]
HOST = "lock-0"
LOCK = "/var/lib/kimi/lock/lock.json"
PLAYBOOK = "tests/support/playbooks/host_lock.yml"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["h200"], names=[HOST])
    try:
        yield hosts
    finally:
        hosts.down()


def ansible_playbook(cluster, playbook: str, *extra: str) -> list[str]:
    return [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(cluster.inventory),
        playbook,
        *extra,
    ]


ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
    # The harness's caches, as run_playbook's runs have them (tests/support/ansible_run.py).
    **controller_bytecode(),
    "ANSIBLE_NOCOLOR": "1",
    # Wide enough that a warning is one line.
    "COLUMNS": "400",
}


def run(cluster, playbook: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ansible_playbook(cluster, playbook, *extra),
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        # Warnings go to stderr: one stream keeps them in order with the tasks.
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


def read_lock(cluster) -> dict | None:
    out = cluster.ssh(HOST, f"cat {LOCK} 2>/dev/null", check=False).stdout
    return json.loads(out) if out.strip() else None


def test_a_second_run_is_refused_and_a_killed_holders_lock_taken_over(cluster, tmp_path):
    gate = f"/tmp/kimi-lock-gate-{secrets.token_hex(4)}"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        ansible_playbook(cluster, PLAYBOOK, "-e", f"host_lock_gate={gate}"),
        cwd=REPO,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        held = None
        while held is None:
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.3)
            held = read_lock(cluster)
        # The holder is the first run's ansible-playbook process, on this controller.
        assert held["pid"] == first.pid
        assert held["controller"] == socket.gethostname()
        assert held["playbook"] == PLAYBOOK
        assert cluster.ssh(HOST, f"stat -c %a {LOCK} $(dirname {LOCK})").stdout.split() == [
            "600",
            "700",
        ]

        second = run(cluster, PLAYBOOK)
        assert second.returncode != 0
        said = second.stdout
        assert "Another run holds this host" in said, said[-3000:]
        for detail in (
            held["run_id"],
            f"pid {first.pid}",
            held["controller"],
            held["user"],
            PLAYBOOK,
            held["since"],
            "kimi_break_lock=true",
        ):
            assert detail in said, detail
        assert read_lock(cluster)["run_id"] == held["run_id"], "the refused run touched the lock"
    finally:
        first.kill()
        first.wait(timeout=30)
        log.close()

    # The holder is gone: the next run takes the lock over, says whose, and releases it.
    third = run(cluster, PLAYBOOK)
    assert third.returncode == 0, third.stdout[-3000:]
    warning = " ".join(third.stdout.split())
    assert "Took over the lock of run " + held["run_id"] in warning, third.stdout[-3000:]
    assert f"pid {first.pid} no longer runs" in warning
    assert read_lock(cluster) is None
    cluster.ssh(HOST, f"pkill -f {gate}", check=False)


def test_runtime_refuses_a_git_url_or_ref_that_git_would_read_as_an_option(cluster, tmp_path):
    proof = f"/tmp/kimi-git-option-{secrets.token_hex(4)}"
    for url, ref in (
        (f"--upload-pack=touch {proof}", "refs/pull/1/head"),
        ("https://example.invalid/sglang.git", f"--upload-pack=touch {proof}"),
    ):
        extravars = {
            "kimi_serving_configs": ["ddtree"],
            "kimi_sglang_git": {"url": url, "ref": ref, "patches": []},
        }
        result = run(cluster, "playbooks/runtime.yml", "-e", json.dumps(extravars))
        assert result.returncode != 0
        said = " ".join(result.stdout.split())
        assert "begins with '-', which git would take for an option" in said, said[-3000:]
        assert json.dumps(f"--upload-pack=touch {proof}") in said
        assert "Fix kimi_sglang_git" in said
        # Refused before anything else ran on the host.
        assert "Check that the host's Python can create a venv" not in said
    assert cluster.ssh(HOST, f"test -e {proof}", check=False).returncode == 1


def test_a_git_remote_that_never_answers_fails_by_the_deadline_naming_it(cluster):
    """Hardening II (3): `git ls-remote` and the checkout had no deadline: a remote that
    accepts and never answers held the deploy, and the per-host lock, forever."""
    port = 9419
    listener = (
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(8); "
        "held = [s.accept() for _ in range(8)]; time.sleep(600)"
    )
    cluster.ssh(HOST, f"nohup python3 -c {json.dumps(listener)} >/dev/null 2>&1 &")
    url = f"http://127.0.0.1:{port}/sglang.git"
    try:
        for git in (
            {"url": url, "ref": "refs/pull/1/head", "patches": []},
            # The study lock's commit: ls-remote is skipped, the checkout asks the remote.
            {"url": url, "ref": "refs/pull/1/head", "commit": "a" * 40, "patches": []},
        ):
            extravars = {
                "kimi_serving_configs": ["ddtree"],
                "kimi_sglang_git": git,
                "runtime_git_timeout_s": 5,
            }
            started = time.monotonic()
            result = run(cluster, "playbooks/runtime.yml", "-e", json.dumps(extravars))
            took = time.monotonic() - started
            assert result.returncode != 0
            said = " ".join(result.stdout.split())
            assert url in said, said[-3000:]
            if "commit" in git:
                assert "could not be checked out from " + url in said, said[-3000:]
            else:
                assert f"git ls-remote {url} refs/pull/1/head did not answer within 5 s" in said
            # Bounded by the deadline, not by the remote (the run's own start takes seconds).
            assert took < 90, took
    finally:
        cluster.ssh(HOST, f"pkill -f 'bind..127.0.0.1., {port}' || true", check=False)
