"""The runtime stage's git path over an SSH test host: SGLang built from a git ref (the DDTree
pull request's, served by a local copy), with patches applied and the commit recorded; a stale
patch and a missing ref fail by name.

Apart from tests/integration/test_server.py, on a host of its own, so that make test's workers
share the two files' time.
"""

from __future__ import annotations

import json

import pytest

from tests.support.fake_sglang import PATCH, build_git_source
from tests.support.hostprep import install_git_source

pytestmark = [pytest.mark.runtime, pytest.mark.integration]

RUNTIME = "playbooks/runtime.yml"


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200"], names=["gitnode"])
    try:
        yield hosts
    finally:
        hosts.down()


def test_git_runtime_checks_out_the_ref_applies_patches_and_records_the_commit(
    playbook, cluster, runtime_wheelhouse, tmp_path
):
    source = build_git_source(tmp_path / "src")
    source["url"] = install_git_source(cluster, "gitnode", tmp_path / "src")
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
    second.assert_unchanged()

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
