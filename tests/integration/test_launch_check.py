"""The deploy-time launch check over an SSH test host: a flag the user added in
kimi_server_settings.extra_args that the runtime does not know fails the deploy naming it, and
the running server is left as it was; the git runtime checks DDTree with its own parser.
(tests/unit/test_launch_check.py runs the probe itself.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.fake_sglang import build_git_source
from tests.support.hostprep import put_file

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime

HOST = "lc"
CHECK = "Check the launch with the runtime's own parser"
START = "Start the server, restarting it only when its launch changed"
SIM_ENV = {"HF_HUB_OFFLINE": "1", "SGLANG_SIM_LOAD_SECONDS": "1", "SGLANG_SIM_STEP_MS": "5"}


@pytest.fixture(scope="module")
def host(runtime_wheelhouse, tmp_path_factory):
    """One host with both runtimes: the release wheel, and the fake DDTree pull request from a
    git repository on the host."""
    from tests.support.ansible_run import run_playbook
    from tests.support.testhosts import TestHostCluster

    cluster = TestHostCluster.up(["ct200"], names=[HOST])
    try:
        src = tmp_path_factory.mktemp("git-src")
        source = build_git_source(src)
        archive = subprocess.run(
            ["tar", "-C", str(src), "-czf", "-", "sglang.git"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        put_file(cluster, HOST, "/root/sglang-git.tgz", archive)
        cluster.ssh(HOST, "mkdir -p /srv/git && tar -C /srv/git -xzf /root/sglang-git.tgz")
        git = {"url": "file:///srv/git/sglang.git", "ref": source["ref"], "patches": []}
        base = {"kimi_serving_configs": ["ar", "ddtree"], "kimi_sglang_git": git}
        installed = run_playbook(
            "playbooks/runtime.yml",
            cluster.inventory,
            tmp_path_factory.mktemp("runtime"),
            extravars={**base, "runtime_wheelhouse": str(runtime_wheelhouse)},
        )
        assert installed.rc == 0, installed.stdout[-4000:]
        yield cluster, base
    finally:
        cluster.down()


def server_vars(base: dict, **extra) -> dict:
    return {
        **base,
        "kimi_server_config": "ar",
        "kimi_server_environment": SIM_ENV,
        "server_health_poll_s": 1,
        "server_restart_delay_s": 1,
        **extra,
    }


def with_extra_args(*args: str) -> str:
    """server_settings as the deploy computes it, with the user's extra flags."""
    extra = json.dumps(list(args))
    return "{{ kimi_server_settings | combine({'extra_args': " + extra + "}) }}"


def server_pid(cluster) -> int:
    state = cluster.ssh(HOST, "cat /var/lib/kimi/server/kimi-sglang.state.json").stdout
    return int(json.loads(state).get("child_pid") or 0)


@pytest.mark.integration
def test_an_unknown_extra_flag_fails_the_deploy_before_the_server_is_touched(playbook, host):
    cluster, base = host
    first = playbook("playbooks/server.yml", cluster.inventory, extravars=server_vars(base))
    assert first.rc == 0, first.stdout[-4000:]
    assert first.results(CHECK)[HOST]["mode"] == "prepare_server_args"
    pid = server_pid(cluster)
    launch = cluster.ssh(HOST, "cat /var/lib/kimi/server/launch.json").stdout

    refused = playbook(
        "playbooks/server.yml",
        cluster.inventory,
        extravars=server_vars(base, server_settings=with_extra_args("--enable-metricz")),
    )
    assert refused.rc != 0
    result = refused.results(CHECK)[HOST]
    assert result["failed"] and result["flags"] == ["--enable-metricz"]
    assert "unrecognized arguments: --enable-metricz" in result["msg"]
    assert "kimi_server_settings.extra_args" in result["msg"]
    assert "The running server was left as it is" in result["msg"]
    assert START not in {e["event_data"].get("task") for e in refused.events}
    # The same server process, launch record and answers as before.
    assert server_pid(cluster) == pid
    assert cluster.ssh(HOST, "cat /var/lib/kimi/server/launch.json").stdout == launch
    code = cluster.ssh(
        HOST,
        "curl -s -o /dev/null -w '%{http_code}' -X POST -d "
        '\'{"text": "hi", "sampling_params": {"max_new_tokens": 2}}\' '
        "http://127.0.0.1:30000/generate",
    ).stdout.strip()
    assert code == "200"

    # A flag the release knows passes, and a second run of the good launch changes nothing.
    again = playbook("playbooks/server.yml", cluster.inventory, extravars=server_vars(base))
    again.assert_unchanged()


@pytest.mark.integration
def test_the_git_runtime_checks_ddtree_with_its_own_parser(playbook, host):
    cluster, base = host
    ddtree = server_vars(base, kimi_server_config="ddtree-b16")
    typo = playbook(
        "playbooks/server.yml",
        cluster.inventory,
        extravars={**ddtree, "server_settings": with_extra_args("--speculative-ddtree-budgt", "8")},
    )
    assert typo.rc != 0
    result = typo.results(CHECK)[HOST]
    assert result["flags"] == ["--speculative-ddtree-budgt"]
    assert result["mode"] == "add_cli_args" and result["version"] == "0.5.23.dev1"
    paged = playbook(
        "playbooks/server.yml",
        cluster.inventory,
        extravars={**ddtree, "server_settings": with_extra_args("--page-size", "64")},
    )
    assert paged.rc != 0
    assert paged.results(CHECK)[HOST]["flags"] == ["--page-size"]
    assert "DDTREE supports only --page-size 1, got 64" in paged.results(CHECK)[HOST]["msg"]
    # The kit's own DDTree launch passes the check and starts.
    started = playbook("playbooks/server.yml", cluster.inventory, extravars=ddtree)
    assert started.rc == 0, started.stdout[-4000:]
    assert started.results(CHECK)[HOST]["errors"] == []
    assert started.results(START)[HOST]["changed"]
