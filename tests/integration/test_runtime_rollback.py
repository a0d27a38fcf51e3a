"""Versioned runtimes over an SSH test host (issue 21 part 5): each SGLang version is built in
its own folder beside the running one and /opt/kimi/venv links to the active one; a server that
fails its health check on a new version goes back to the previous one by itself, and
-e kimi_runtime_rollback=true goes back on purpose.

The stand-in sglang wheels (tests/support/fake_sglang.py) come in three versions: 0.5.23 and
0.5.23.post2 serve, 0.5.23.post1 crashes on start (its launch_server sets the simulator's
SGLANG_SIM_CRASH_ON_START). One host whose PID 1 is sshd: the kit's supervisor runs the server.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.fake_sglang import REQUIRES, package_files, wheel
from tests.support.sim_process import QUICK_POLLS

pytestmark = [pytest.mark.runtime, pytest.mark.integration]

HOST = "rbnode"
DEPLOY = "deploy_kimi.yml"
VERSIONS = "/opt/kimi/runtimes"
LINK = "/opt/kimi/venv"
GOOD, CRASHING, GOOD_TOO = "0.5.23", "0.5.23.post1", "0.5.23.post2"
PLAN = "Work out the runtime's version"
START = "Start the server, restarting it only when its launch changed"
ROLLED_BACK = "Fail with the runtime that failed and where the host is now"
CRASH_LAUNCH = (
    "import os\nimport sys\n\n"
    'os.environ["SGLANG_SIM_CRASH_ON_START"] = "1"\n'
    "from sglang.simulator import main\n\nsys.exit(main())\n"
)


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200"], names=[HOST])
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def wheels(runtime_wheelhouse, tmp_path_factory):
    """sglang 0.5.23 and its requirements from the runtime wheelhouse (only those: every deploy
    copies the wheelhouse to the host), plus a crashing and another serving version."""
    folder = tmp_path_factory.mktemp("rollback-wheelhouse")
    needed = {"sglang", "pyyaml", "packaging", "jinja2", "markupsafe"}
    for found in runtime_wheelhouse.glob("*.whl"):
        if found.name.split("-")[0].lower() in needed:
            shutil.copy2(found, folder)
    crashing = package_files(CRASHING)
    crashing["sglang/launch_server.py"] = CRASH_LAUNCH.encode()
    wheel(folder, "sglang", CRASHING, crashing, REQUIRES)
    wheel(folder, "sglang", GOOD_TOO, package_files(GOOD_TOO), REQUIRES)
    return folder


def deploy(playbook, cluster, wheels, version, **extra):
    extravars = {
        "kimi_sglang_version": version,
        "runtime_wheelhouse": str(wheels),
        "kimi_serving_configs": ["ar"],
        "kimi_server_config": "ar",
        "kimi_server_environment": {
            **QUICK_POLLS,
            "HF_HUB_OFFLINE": "1",
            "SGLANG_SIM_LOAD_SECONDS": "1",
            "SGLANG_SIM_STEP_MS": "5",
        },
        "server_health_poll_s": 1,
        "server_restart_delay_s": 1,
        "server_health_timeout_s": 60,
        # Not what this test is about; a dozen tasks less per deploy.
        "kimi_server_api_check": False,
        **extra,
    }
    return playbook(
        DEPLOY, cluster.inventory, extravars=extravars, limit=HOST, tags="runtime,server"
    )


def on_host(cluster, command: str) -> str:
    return cluster.ssh(HOST, command).stdout.strip()


def active(cluster) -> str:
    return on_host(cluster, f"readlink {LINK}")


def server_pid(cluster) -> int:
    state = json.loads(on_host(cluster, "cat /var/lib/kimi/server/kimi-sglang.state.json"))
    return int(state.get("child_pid") or 0)


def health(cluster) -> str:
    return on_host(
        cluster,
        "curl -s -o /dev/null -w '%{http_code}' --max-time 30 "
        "http://127.0.0.1:30000/health_generate",
    )


def launch_runtime(cluster) -> str:
    return json.loads(on_host(cluster, "cat /var/lib/kimi/server/launch.json"))["runtime_dir"]


def test_a_failed_runtime_goes_back_by_itself_and_a_rollback_goes_back_on_purpose(
    playbook, cluster, wheels
):
    # A host an earlier kit deployed: a real venv at the link's path, kept as a version.
    cluster.ssh(HOST, f"python3 -m venv --without-pip {LINK}")
    first = deploy(playbook, cluster, wheels, GOOD)
    assert first.rc == 0, first.stdout
    version_a = first.results(PLAN)[HOST]["name"]
    dir_a = f"{VERSIONS}/{version_a}"
    assert active(cluster) == dir_a
    assert on_host(cluster, f"ls {VERSIONS}").split() == sorted([version_a, "release-unversioned"])
    assert on_host(cluster, f"test -x {VERSIONS}/release-unversioned/bin/python && echo kept")
    record = json.loads(on_host(cluster, "cat /opt/kimi/runtime/runtime.json"))["release"]
    assert (record["runtime_dir"], record["runtime_version"]) == (dir_a, version_a)
    assert launch_runtime(cluster) == dir_a
    assert health(cluster) == "200"
    pid_a = server_pid(cluster)

    # A new version whose server crashes: built beside A, switched to, failed, switched back.
    failed = deploy(playbook, cluster, wheels, CRASHING)
    assert failed.rc != 0
    version_b = failed.results(PLAN)[HOST]["name"]
    assert version_b != version_a
    message = failed.results(ROLLED_BACK)[HOST]["msg"]
    assert f"failed on the new runtime {version_b} ({VERSIONS}/{version_b})" in message
    assert "crashed while starting" in message or "not running" in message, message
    assert f"went back to {version_a} ({dir_a}), which is healthy again" in message
    assert "Fix: " in message
    assert active(cluster) == dir_a
    assert launch_runtime(cluster) == dir_a
    assert health(cluster) == "200"
    # The benchmark's provenance names the runtime that runs again, not the one that failed.
    record = json.loads(on_host(cluster, "cat /opt/kimi/runtime/runtime.json"))["release"]
    assert (record["version"], record["runtime_version"]) == (GOOD, version_a)
    pid_back = server_pid(cluster)
    assert pid_back not in (0, pid_a)
    cmdline = on_host(cluster, f"tr '\\0' ' ' < /proc/{pid_back}/cmdline")
    assert cmdline.startswith(f"{LINK}/bin/python -m sglang.launch_server")

    # Another version that serves: B is pruned (keep 2: C active, A to roll back to; the
    # unversioned one stays, nothing could rebuild it).
    good = deploy(playbook, cluster, wheels, GOOD_TOO)
    assert good.rc == 0, good.stdout
    version_c = good.results(PLAN)[HOST]["name"]
    assert active(cluster) == f"{VERSIONS}/{version_c}"
    assert on_host(cluster, f"ls {VERSIONS}").split() == sorted(
        [version_a, version_c, "release-unversioned"]
    )
    assert good.results(START)[HOST]["action"] == "restarted"

    # On purpose: back to A with C's settings, installing nothing; a second time changes nothing.
    back = deploy(playbook, cluster, wheels, GOOD_TOO, kimi_runtime_rollback=True)
    assert back.rc == 0, back.stdout
    assert back.results("Go back to the previous runtime")[HOST]["changed"] is True
    assert back.results("Install the pinned SGLang release") == {}
    assert active(cluster) == dir_a
    assert back.results(START)[HOST]["action"] == "restarted"
    assert launch_runtime(cluster) == dir_a
    assert health(cluster) == "200"
    record = json.loads(on_host(cluster, "cat /opt/kimi/runtime/runtime.json"))["release"]
    assert (record["version"], record["runtime_version"]) == (GOOD, version_a)
    again = deploy(playbook, cluster, wheels, GOOD_TOO, kimi_runtime_rollback=True)
    again.assert_unchanged()
    assert active(cluster) == dir_a


def test_a_rollback_without_a_previous_runtime_fails_clearly(playbook, cluster, wheels):
    # The history gone: nothing is known to have been active before.
    cluster.ssh(HOST, "rm -f /opt/kimi/runtime/versions.json")
    refused = deploy(playbook, cluster, wheels, GOOD, kimi_runtime_rollback=True)
    assert refused.rc != 0
    assert refused.results("Say where the rollback went")[HOST]["msg"].startswith(
        "The release runtime has no version to go back to: it stays as it is."
    )
    message = refused.results("Stop when no runtime had a version to go back to")[HOST]["msg"]
    assert message.startswith(f"No previous runtime on {HOST}: no runtime (release) has"), message
