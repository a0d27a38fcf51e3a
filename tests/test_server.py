"""The runtime and server stages over SSH test hosts, with the simulator installed as sglang.

tests/fake_sglang.py packages tests/sglang_sim.py as an `sglang` 0.5.23 wheel; the runtime role
installs it from a wheelhouse like the real release, and the server role runs
`python -m sglang.launch_server` under the kit's supervisor (systemd is not PID 1 on test
hosts). The systemd path is covered by a unit file checked with `systemd-analyze verify` and
a recording systemctl.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.fake_sglang import PATCH, build_git_source
from tests.hostprep import put_file

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.runtime, pytest.mark.integration]

HOST = "node"
API_KEY = "sk-kimi-tests-4f1b9c"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - inside the test host's own network namespace
RUNTIME = "playbooks/runtime.yml"
SERVER = "playbooks/server.yml"
START = "Start the server, restarting it only when its launch changed"
WAIT = "Wait for /health_generate"
FAIL = "Fail with what the server said"
CHECK_RELEASE = "Check the release runtime against the sglang wheel's own requirements"
SIM_ENV = {"HF_HUB_OFFLINE": "1", "SGLANG_SIM_LOAD_SECONDS": "1", "SGLANG_SIM_STEP_MS": "5"}


@pytest.fixture(scope="module")
def cluster():
    from tests.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200", "ct200", "ct200"], names=[HOST, "gitnode", "sysd"])
    try:
        yield hosts
    finally:
        hosts.down()


def server_vars(**extra) -> dict:
    return {
        "kimi_serving_configs": ["ar", "dflash"],
        "kimi_server_config": "ar",
        "kimi_server_environment": SIM_ENV,
        "server_health_poll_s": 1,
        "server_restart_delay_s": 1,
        **extra,
    }


def run_server(playbook, cluster, limit=HOST, **extra):
    return playbook(SERVER, cluster.inventory, extravars=server_vars(**extra), limit=limit)


def send(cluster, path: Path, host=HOST) -> str:
    """Copies a controller file to the same name under /root on the host; returns that path."""
    target = f"/root/{path.name}"
    put_file(cluster, host, target, path.read_bytes())
    return target


def supervisor_state(cluster, host=HOST) -> dict:
    out = cluster.ssh(host, "cat /var/lib/kimi/server/kimi-sglang.state.json").stdout
    return json.loads(out)


def server_pid(cluster, host=HOST) -> int:
    return int(supervisor_state(cluster, host)["child_pid"])


def generate(cluster, host=HOST, port=30000, key=None) -> str:
    header = f"-H 'Authorization: Bearer {key}' " if key else ""
    return cluster.ssh(
        host,
        f"curl -s -o /dev/null -w '%{{http_code}}' {header}-X POST "
        f'-d \'{{"text": "hi", "sampling_params": {{"max_new_tokens": 4}}}}\' '
        f"http://127.0.0.1:{port}/generate",
        check=False,
    ).stdout.strip()


@pytest.fixture(scope="module")
def runtime(cluster, runtime_wheelhouse, tmp_path_factory):
    from tests.ansible_run import run_playbook

    extravars = {
        "kimi_serving_configs": ["ar", "dflash"],
        "runtime_wheelhouse": str(runtime_wheelhouse),
    }
    first = run_playbook(
        RUNTIME,
        cluster.inventory,
        tmp_path_factory.mktemp("runtime-1"),
        extravars=extravars,
        limit=f"{HOST},sysd",
    )
    second = run_playbook(
        RUNTIME,
        cluster.inventory,
        tmp_path_factory.mktemp("runtime-2"),
        extravars=extravars,
        limit=f"{HOST},sysd",
    )
    return first, second, extravars


def test_runtime_installs_the_pinned_release_and_records_it(cluster, runtime):
    first, second, _ = runtime
    assert first.rc == 0, first.stdout
    assert second.rc == 0, second.stdout
    assert sum(second.changed().values()) == 0
    record = json.loads(cluster.ssh(HOST, "cat /opt/kimi/runtime/runtime.json").stdout)
    release = record["release"]
    assert release["version"] == "0.5.23"
    assert release["import_version"] == "0.5.23"
    assert release["ok"] and release["pip_check"]["ok"]
    pins = {r["name"]: r["installed"] for r in release["requirements"]}
    assert pins == {
        "pyyaml": "6.0.4", "packaging": "26.4", "jinja2": "3.1.6", "markupsafe": "3.0.4"
    }  # fmt: skip
    assert record["git"] is None


def test_runtime_restores_a_changed_pin_and_names_what_pip_cannot_fix(
    playbook, cluster, runtime, tmp_path
):
    from tests.fake_sglang import wheel

    _, _, extravars = runtime
    # An older packaging replaces sglang's pin, as a stray `pip install` would.
    old = send(cluster, wheel(tmp_path, "packaging", "25.0", {"packaging/__init__.py": b""}, []))
    plugin = send(
        cluster, wheel(tmp_path, "kimi-plugin", "1.0", {"kimi_plugin.py": b""}, ["packaging==25.0"])
    )
    cluster.ssh(HOST, f"/opt/kimi/venv/bin/python -m pip install -q --no-deps {old}")
    restored = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST)
    assert restored.rc == 0, restored.stdout
    assert restored.results("Install the pinned SGLang release")[HOST]["changed"]
    record = json.loads(cluster.ssh(HOST, "cat /opt/kimi/runtime/runtime.json").stdout)
    assert record["release"]["packages"]["packaging"] == "26.4"

    # A package added by hand that needs other versions: pip check is not clean.
    cluster.ssh(HOST, f"/opt/kimi/venv/bin/python -m pip install -q --no-deps {plugin}")
    refused = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST)
    assert refused.rc != 0, refused.stdout
    message = refused.results(CHECK_RELEASE)[HOST]["msg"]
    assert "pip check: kimi-plugin 1.0 has requirement packaging==25.0" in message
    assert "uninstall what was added to the environment by hand" in message
    cluster.ssh(HOST, "/opt/kimi/venv/bin/python -m pip uninstall -q -y kimi-plugin")

    # sglang's own pin broken where pip install does not look (check mode: no install).
    cluster.ssh(HOST, f"/opt/kimi/venv/bin/python -m pip install -q --no-deps {old}")
    checked = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST, check=True)
    message = checked.results(CHECK_RELEASE)[HOST]["msg"]
    assert "packaging: 25.0, but sglang 0.5.23 requires packaging==26.4" in message
    assert playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST).rc == 0
    again = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST)
    assert sum(again.changed().values()) == 0


def test_git_runtime_checks_out_the_ref_applies_patches_and_records_the_commit(
    playbook, cluster, runtime_wheelhouse, tmp_path
):
    source = build_git_source(tmp_path / "src")
    # The repository goes to the host (its /tmp is not the controller's): a local git server.
    archive = subprocess.run(
        ["tar", "-C", str(tmp_path / "src"), "-czf", "-", "sglang.git"],
        capture_output=True,
        check=True,
    ).stdout
    put_file(cluster, "gitnode", "/root/sglang-git.tgz", archive)
    cluster.ssh("gitnode", "mkdir -p /srv/git && tar -C /srv/git -xzf /root/sglang-git.tgz")
    source["url"] = "file:///srv/git/sglang.git"
    patch = tmp_path / "ddtree.patch"
    patch.write_text(PATCH)
    extravars = {
        "kimi_serving_configs": ["ddtree"],
        "runtime_wheelhouse": str(runtime_wheelhouse),
        "kimi_sglang_git": {"url": source["url"], "ref": source["ref"], "patches": [str(patch)]},
    }
    first = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="gitnode")
    assert first.rc == 0, first.stdout
    record = json.loads(cluster.ssh("gitnode", "cat /opt/kimi/runtime/runtime.json").stdout)
    assert record["release"] is None
    git = record["git"]
    assert git["source"]["commit"] == source["commit"]
    assert git["source"]["ref"] == "refs/pull/29907/head"
    assert git["source"]["patches"][0]["name"] == "00-ddtree.patch"
    assert git["version"] == "0.5.23.dev1" and git["ok"]
    patched = cluster.ssh(
        "gitnode", "/opt/kimi/venv-git/bin/python -c 'import sglang.ddtree as d; print(d.PATCHED)'"
    )
    assert patched.stdout.strip() == "True"
    second = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="gitnode")
    assert sum(second.changed().values()) == 0

    bad = tmp_path / "stale.patch"
    bad.write_text(PATCH.replace("BUDGETS = (16, 32, 64, 128)", "BUDGETS = (1,)"))
    refused = playbook(
        RUNTIME,
        cluster.inventory,
        extravars={
            **extravars,
            "kimi_sglang_git": {**extravars["kimi_sglang_git"], "patches": [str(bad)]},
        },
        limit="gitnode",
    )
    assert refused.rc != 0
    message = refused.results("Stop when a patch does not apply")["gitnode"]["msg"]
    assert f"Patch {bad} does not apply to {source['commit']}" in message

    missing = playbook(
        RUNTIME,
        cluster.inventory,
        extravars={
            **extravars,
            "kimi_sglang_git": {"url": source["url"], "ref": "refs/pull/1/head"},
        },
        limit="gitnode",
    )
    assert (
        "refs/pull/1/head was not found at"
        in missing.results("Stop when the ref does not exist")["gitnode"]["msg"]
    )


def test_server_starts_healthy_and_a_second_run_changes_nothing(playbook, cluster, runtime):
    first = run_server(playbook, cluster)
    assert first.rc == 0, first.stdout
    assert first.results(START)[HOST]["action"] == "started"
    assert first.results(WAIT)[HOST]["state"] == "healthy"
    pid = server_pid(cluster)
    assert generate(cluster) == "200"
    second = run_server(playbook, cluster)
    assert second.rc == 0, second.stdout
    assert sum(second.changed().values()) == 0
    assert server_pid(cluster) == pid
    modes = cluster.ssh(HOST, "stat -c '%a %n' /etc/kimi/kimi-sglang.env").stdout
    assert modes.startswith("600 ")


def test_argv_change_restarts_exactly_once(playbook, cluster, runtime):
    assert run_server(playbook, cluster).rc == 0
    before = server_pid(cluster)
    changed = run_server(playbook, cluster, kimi_server_config="dflash")
    assert changed.rc == 0, changed.stdout
    assert changed.results(START)[HOST]["action"] == "restarted"
    after = server_pid(cluster)
    assert after != before
    cmdline = cluster.ssh(HOST, f"tr '\\0' ' ' < /proc/{after}/cmdline").stdout
    assert "--speculative-algorithm DFLASH" in cmdline
    again = run_server(playbook, cluster, kimi_server_config="dflash")
    assert sum(again.changed().values()) == 0
    assert server_pid(cluster) == after
    assert supervisor_state(cluster)["restarts"] == 0


def test_a_crashed_server_is_restarted_by_the_supervisor(playbook, cluster, runtime):
    assert run_server(playbook, cluster).rc == 0
    pid = server_pid(cluster)
    cluster.ssh(HOST, f"kill -9 {pid}")
    deadline = time.monotonic() + 30
    state = {}
    while time.monotonic() < deadline:
        state = supervisor_state(cluster)
        if state.get("status") == "running" and state.get("child_pid") not in (None, pid):
            break
        time.sleep(0.3)
    assert state["restarts"] == 1 and state["last_exit"] == -9, state
    log = cluster.ssh(HOST, "cat /var/log/kimi/sglang.log").stdout
    assert "server exited with status -9; restart 1" in log
    # Still the wanted launch: the next run has nothing to do.
    deadline = time.monotonic() + 30
    while generate(cluster) != "200" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sum(run_server(playbook, cluster).changed().values()) == 0


def test_health_timeout_fails_with_the_log_tail(playbook, cluster, runtime):
    slow = run_server(
        playbook,
        cluster,
        kimi_server_environment={**SIM_ENV, "SGLANG_SIM_LOAD_SECONDS": "600"},
        server_health_timeout_s=4,
    )
    assert slow.rc != 0
    message = slow.results(FAIL)[HOST]["msg"]
    assert "no answer from /health_generate within 4 s" in message
    tail = slow.results("Show the end of the server's log")[HOST]["msg"]
    assert any("simulated sglang 0.5.23 serving on 127.0.0.1:30000" in line for line in tail)


def test_crash_on_start_fails_fast_with_the_log_tail(playbook, cluster, runtime):
    started = time.monotonic()
    crashing = run_server(
        playbook,
        cluster,
        kimi_server_environment={**SIM_ENV, "SGLANG_SIM_CRASH_ON_START": "1"},
        server_health_timeout_s=300,
    )
    assert crashing.rc != 0
    assert time.monotonic() - started < 120
    message = crashing.results(FAIL)[HOST]["msg"]
    assert "crashed while starting" in message or "not running" in message
    tail = crashing.results("Show the end of the server's log")[HOST]["msg"]
    assert any("simulated crash on start" in line for line in tail)


def test_api_key_beyond_loopback_stays_off_the_command_line(playbook, cluster, runtime, tmp_path):
    run = run_server(
        playbook, cluster, kimi_server_host=ALL_INTERFACES, kimi_server_api_key=API_KEY
    )
    assert run.rc == 0, run.stdout
    pid = server_pid(cluster)
    cmdline = cluster.ssh(HOST, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert API_KEY not in cmdline
    assert "--config /etc/kimi/sglang-secrets.yaml" in cmdline
    assert cluster.ssh(HOST, "stat -c %a /etc/kimi/sglang-secrets.yaml").stdout.strip() == "600"
    assert generate(cluster) == "401"
    assert generate(cluster, key=API_KEY) == "200"
    unit_files = cluster.ssh(
        HOST, "cat /var/lib/kimi/server/launch.json /etc/kimi/kimi-sglang-supervise.json"
    ).stdout
    assert API_KEY not in unit_files
    # What the run wrote (the test's own extravars under env/ hold the key it passed in).
    for path in (Path(run.private_dir) / "artifacts").rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(errors="replace"), path
    # Back to loopback: the key file goes away.
    assert run_server(playbook, cluster).rc == 0
    assert cluster.ssh(HOST, "test -e /etc/kimi/sglang-secrets.yaml", check=False).returncode == 1


def test_teardown_stops_the_server(playbook, cluster, runtime):
    assert run_server(playbook, cluster).rc == 0
    pid = server_pid(cluster)
    down = playbook("teardown.yml", cluster.inventory, extravars=server_vars(), limit=HOST)
    assert down.rc == 0, down.stdout
    assert down.results("Stop the server")[HOST]["action"] == "stopped"
    assert cluster.ssh(HOST, f"test -d /proc/{pid}", check=False).returncode == 1
    assert supervisor_state(cluster)["status"] == "stopped"
    again = playbook("teardown.yml", cluster.inventory, extravars=server_vars(), limit=HOST)
    assert again.results("Stop the server")[HOST]["changed"] is False


SYSTEMCTL = r"""#!/bin/sh
# Records every call; answers `show` like systemd for a unit that has never run.
echo "$*" >> /var/log/fake-systemctl.log
case "$1" in
  show) printf '%s\n' LoadState=not-found ActiveState=inactive SubState=dead MainPID=0 \
          NRestarts=0 UnitFileState=disabled NeedDaemonReload=no ExecMainStatus=0 ;;
esac
exit 0
"""


def test_systemd_unit_is_valid_and_started_through_systemctl(playbook, cluster, runtime):
    cluster.ssh(
        "sysd",
        "mkdir -p /run/systemd/system && cat > /usr/local/bin/systemctl"
        " && chmod 755 /usr/local/bin/systemctl",
        input=SYSTEMCTL,
    )
    run = run_server(
        playbook,
        cluster,
        limit="sysd",
        kimi_server_host=ALL_INTERFACES,
        kimi_server_api_key=API_KEY,
        server_wait_for_health=False,
    )
    assert run.rc == 0, run.stdout
    assert run.results(START)["sysd"]["action"] == "started"
    calls = cluster.ssh("sysd", "cat /var/log/fake-systemctl.log").stdout.splitlines()
    assert [c for c in calls if not c.startswith("show")] == [
        "daemon-reload",
        "enable kimi-sglang",
        "start kimi-sglang",
    ]
    unit = cluster.ssh("sysd", "cat /etc/systemd/system/kimi-sglang.service").stdout
    assert API_KEY not in unit
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    assert re.search(r"^EnvironmentFile=/etc/kimi/kimi-sglang.env$", unit, re.M)
    assert re.search(r"^LimitNOFILE=1048576$", unit, re.M)
    verify = cluster.ssh(
        "sysd",
        "SYSTEMD_LOG_LEVEL=warning systemd-analyze verify /etc/systemd/system/kimi-sglang.service",
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
