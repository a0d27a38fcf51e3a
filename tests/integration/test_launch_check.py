"""The deploy-time launch check of the git runtime over an SSH test host: DDTree's launch is
checked with that runtime's own parser. (tests/integration/test_server.py checks the release's:
a flag the runtime does not know fails the deploy naming it, and the running server is left as
it was; tests/unit/test_launch_check.py runs the probe itself.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.ansible_run import with_extra_args
from tests.support.fake_sglang import build_git_source
from tests.support.hostprep import put_file
from tests.support.sim_process import SERVER_ENV as SIM_ENV

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime

HOST = "lc"
CHECK = "Look at what the host has for this launch and check it with the runtime's own parser"
START = "Start the server, restarting it only when its launch changed"


@pytest.fixture(scope="module")
def host(runtime_wheelhouse, tmp_path_factory):
    """One host with the git runtime: the fake DDTree pull request from a git repository on the
    host."""
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
        base = {"kimi_serving_configs": ["ddtree"], "kimi_sglang_git": git}
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
        "kimi_server_config": "ddtree-b16",
        "kimi_server_environment": SIM_ENV,
        "server_health_poll_s": 1,
        "server_restart_delay_s": 1,
        **extra,
    }


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
