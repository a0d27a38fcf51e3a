"""The runtime stage's git path over an SSH test host: SGLang built from a git ref (the DDTree
pull request's, served by a local copy), with patches applied and the commit recorded; a stale
patch and a missing ref fail by name. And the frozen runtime (issue 20 part 2): a first install
records its package set into the study lock, a fresh host deploys exactly that set from it, a
changed package is named, and a lock built from another source is refused.

Apart from tests/integration/test_server.py, on a host of its own, so that make test's workers
share the two files' time.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.fake_sglang import PATCH, build_git_source, wheel
from tests.support.hostprep import install_git_source, put_file

pytestmark = [pytest.mark.runtime, pytest.mark.integration]

RUNTIME = "playbooks/runtime.yml"


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200", "ct200", "ct200"], names=["gitnode", "node-a", "node-b"])
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
    lock = tmp_path / "kimi.lock.yml"
    extravars = {
        "kimi_lock_file": str(lock),
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
    # The first install recorded its set, sglang left out (its commit pins it).
    frozen = yaml.safe_load(lock.read_text())["runtime"]["git"]
    assert frozen["built_from"] == {
        "commit": source["commit"],
        "patches": [git["source"]["patches"][0]],
    }
    assert "sglang" not in frozen["packages"] and "pip" not in frozen["packages"]
    assert frozen["packages"]["packaging"]["version"] == "26.4"
    assert frozen["hashes"] == "complete" and frozen["recorded_from"] == "gitnode"
    # Now followed: the venv already holds exactly the set.
    second = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="gitnode")
    second.assert_unchanged()
    shown = second.results("Show how the environment differs from the study lock")["gitnode"]
    assert shown["msg"] == f"Exactly the study lock's {len(frozen['packages'])} packages."

    # The study lock pins the commit the ref resolved to.
    assert yaml.safe_load(lock.read_text())["git"]["sglang"]["commit"] == source["commit"]

    # A fresh host gets the locked set without resolving, then sglang from the locked commit,
    # even though the pull request was force-pushed since: its ref no longer reaches that
    # commit (which the remote still holds, as GitHub does), so it is fetched by its SHA.
    install_git_source(cluster, "node-b", tmp_path / "src")
    cluster.ssh(
        "node-b",
        "cd /srv/git/sglang.git && git update-ref refs/keep/locked refs/pull/29907/head && "
        "moved=$(GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t "
        "GIT_COMMITTER_EMAIL=t@t git commit-tree 'main^{tree}' -p main -m force-pushed) && "
        "git update-ref refs/pull/29907/head $moved",
    )
    fresh = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="node-b")
    assert fresh.rc == 0, fresh.stdout
    fetched = fresh.results("Fetch the locked commit by itself")["node-b"]
    assert fetched["rc"] == 0 and not fetched.get("skipped"), fetched
    built = json.loads(cluster.ssh("node-b", "cat /opt/kimi/runtime/runtime.json").stdout)
    assert built["git"]["source"]["commit"] == source["commit"]
    frozen_text = cluster.ssh("node-b", "cat /opt/kimi/runtime/git-frozen.txt").stdout
    assert "sglang" not in frozen_text and frozen_text.count("--hash=sha256:") == len(
        frozen["packages"]
    )
    assert installed_set(cluster, "node-b", "venv-git") == installed_set(
        cluster, "gitnode", "venv-git"
    )
    patched = cluster.ssh(
        "node-b", "/opt/kimi/venv-git/bin/python -c 'import sglang.ddtree as d; print(d.PATCHED)'"
    )
    assert patched.stdout.strip() == "True"

    # Another patch is another source: the lock's set is not installed over it.
    other = tmp_path / "other.patch"
    other.write_text(PATCH.replace("PATCHED = True", "PATCHED = True  # other"))
    moved = playbook(
        RUNTIME,
        cluster.inventory,
        extravars={
            **extravars,
            "kimi_sglang_git": {**extravars["kimi_sglang_git"], "patches": [str(other)]},
        },
        limit="gitnode",
    )
    assert moved.rc != 0
    message = moved.results("Stop when the study lock's runtime was built from another source")
    assert source["commit"] in message["gitnode"]["msg"]
    assert "00-other.patch" in message["gitnode"]["msg"]
    assert "plan.yml -e kimi_lock_update=true" in message["gitnode"]["msg"]

    bad = tmp_path / "stale.patch"
    bad.write_text(PATCH.replace("BUDGETS = (16, 32, 64, 128)", "BUDGETS = (1,)"))
    refused = playbook(
        RUNTIME,
        cluster.inventory,
        extravars={
            **extravars,
            "kimi_lock_file": str(tmp_path / "stale.lock.yml"),
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
            "kimi_lock_file": str(tmp_path / "missing.lock.yml"),
            "kimi_sglang_git": {"url": source["url"], "ref": "refs/pull/1/head"},
        },
        limit="gitnode",
    )
    assert (
        "refs/pull/1/head was not found at"
        in missing.results("Stop when the ref does not exist")["gitnode"]["msg"]
    )


def installed_set(cluster, host: str, venv: str = "venv") -> dict[str, str]:
    done = cluster.ssh(host, f"/opt/kimi/{venv}/bin/python -m pip list --format json")
    return {item["name"].lower(): item["version"] for item in json.loads(done.stdout)}


def test_a_fresh_host_deploys_the_locked_set_and_a_changed_package_is_named(
    playbook, cluster, runtime_wheelhouse, tmp_path
):
    lock = tmp_path / "kimi.lock.yml"
    extravars = {
        "kimi_lock_file": str(lock),
        "kimi_serving_configs": ["ar"],
        "runtime_wheelhouse": str(runtime_wheelhouse),
    }
    # Two hosts without a lock side by side: one records, the other is compared with it.
    first = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="node-a,gitnode")
    assert first.rc == 0, first.stdout
    frozen = yaml.safe_load(lock.read_text())["runtime"]["release"]
    assert frozen["built_from"] == {"sglang": "0.5.23"}
    shown = first.results("Show what the study lock holds for the runtime")
    recorder = frozen["recorded_from"]
    [other] = {"node-a", "gitnode"} - {recorder}
    assert shown[recorder]["msg"].startswith(f"Recorded {len(frozen['packages'])} packages")
    assert f"recorded by {recorder}; this host is compared" in shown[other]["msg"]
    compared = first.results("Warn when this host differs from the set another host recorded")
    assert compared[other]["drift"] == [] and not compared[other].get("warnings")
    # The wheelhouse's wheels all have hashes in pip's report (pip 23.0's older field).
    assert frozen["hashes"] == "complete"
    assert all(len(p["sha256"]) == 64 for p in frozen["packages"].values())
    expected = {"sglang": "0.5.23", "pyyaml": "6.0.4", "packaging": "26.4", "jinja2": "3.1.6"}
    assert {name: frozen["packages"][name]["version"] for name in expected} == expected
    record_a = json.loads(cluster.ssh(recorder, "cat /opt/kimi/runtime/runtime.json").stdout)
    assert frozen["python"] == record_a["release"]["python_version"]
    assert frozen["platform"] == {
        "driver": "580.159.04",
        "driver_cuda": "13.0",
        "machine": "x86_64",
    }
    assert record_a["release"]["platform"] == frozen["platform"]
    set_a = installed_set(cluster, "node-a")
    assert {n: set_a[n] for n in set_a if n not in ("pip", "setuptools", "wheel")} == {
        name: entry["version"] for name, entry in frozen["packages"].items()
    }

    fresh = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="node-b")
    assert fresh.rc == 0, fresh.stdout
    how = fresh.results("Say how the locked set is installed")["node-b"]["msg"]
    assert f"{len(frozen['packages'])} packages of runtime.release with --require-hashes" in how
    assert installed_set(cluster, "node-b") == set_a
    # B followed the lock; it did not record over the first set.
    assert yaml.safe_load(lock.read_text())["runtime"]["release"] == frozen
    assert cluster.ssh("node-b", "cat /opt/kimi/runtime/release-frozen.txt").stdout.count(
        "--hash=sha256:"
    ) == len(frozen["packages"])

    # One package changed by hand on B.
    changed = wheel(
        tmp_path / "private", "packaging", "26.3", {"packaging/__init__.py": b"V = 1\n"}, []
    )
    put_file(cluster, "node-b", f"/root/{changed.name}", changed.read_bytes())
    cluster.ssh(
        "node-b",
        "/opt/kimi/venv/bin/python -m pip install --quiet --no-deps --disable-pip-version-check "
        f"/root/{changed.name}",
    )
    checked = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="node-b", check=True)
    assert checked.rc == 0, checked.stdout
    report = checked.results("Show how the environment differs from the study lock")["node-b"]
    assert report["msg"] == "Differs from the study lock: packaging: locked 26.4, installed 26.3."
    assert installed_set(cluster, "node-b")["packaging"] == "26.3"

    restored = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="node-b")
    assert restored.rc == 0, restored.stdout
    assert (
        "Install the locked versions without resolving anything"
        in (restored.changed_tasks()["node-b"])
    )
    assert installed_set(cluster, "node-b") == set_a
    playbook(RUNTIME, cluster.inventory, extravars=extravars, limit="node-b").assert_unchanged()

    # A set recorded on another Python is not installed into this one.
    older = yaml.safe_load(lock.read_text())
    older["runtime"]["release"]["python"] = "3.1.4"
    other_lock = tmp_path / "other-python.lock.yml"
    other_lock.write_text(yaml.safe_dump(older))
    refused = playbook(
        RUNTIME,
        cluster.inventory,
        extravars={**extravars, "kimi_lock_file": str(other_lock)},
        limit="node-b",
    )
    assert refused.rc != 0
    message = refused.results("Stop when the Python is not the study lock's")["node-b"]["msg"]
    assert f"The release runtime's Python is {frozen['python']}" in message
    assert "recorded on Python 3.1.4" in message and "runtime_python to a Python 3.1" in message
    assert "plan.yml -e kimi_lock_update=true" in message
