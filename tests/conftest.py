"""Shared fixtures: SSH test hosts in network namespaces and playbook runs."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.support import testhosts, timings
from tests.support.ansible_run import run_playbook

REPO = Path(__file__).resolve().parent.parent
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"


def _terminate(signum, frame):
    # Turn SIGTERM into the same unwinding as Ctrl-C, so fixtures tear hosts down.
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    for plugin in timings.plugins_for(config):
        config.pluginmanager.register(plugin, f"kit-{type(plugin).__name__.lower()}")


def pytest_sessionstart(session):
    signal.signal(signal.SIGTERM, _terminate)
    if os.geteuid() == 0:
        testhosts.down_runs(stale_only=True)


REAL_SYSCTL = Path("/proc/sys/kernel/numa_balancing")


@pytest.fixture(scope="module")
def real_machine_untouched():
    """Whatever a test does, this machine's own NUMA balancing stays as it was."""
    before = REAL_SYSCTL.read_text() if REAL_SYSCTL.exists() else None
    yield
    after = REAL_SYSCTL.read_text() if REAL_SYSCTL.exists() else None
    assert after == before, "a test changed this machine's kernel.numa_balancing"


@pytest.fixture
def make_testhosts():
    """Factory: make_testhosts(["ct200", "h200"]) -> a running TestHostCluster, removed after."""
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (network and mount namespaces)")
    clusters = []

    def make(profiles, **kwargs):
        cluster = testhosts.TestHostCluster.up(profiles, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.down()


@pytest.fixture
def playbook(tmp_path):
    """run(playbook, inventory, **kwargs) with a fresh ansible-runner folder per call."""
    calls = iter(range(1000))

    def run(path, inventory, **kwargs):
        private = tmp_path / f"runner-{next(calls)}"
        private.mkdir()
        return run_playbook(path, inventory, private, **kwargs)

    return run


# Custom modules import ansible.module_utils.<stage>.<name> from the repo's module_utils/, the
# way Ansible ships them to a host; module_utils/__init__.py makes the same names importable
# in-process for unit tests.
import module_utils  # noqa: E402, F401


def downloaded_wheels(requirements: Path, folder: Path) -> Path:
    """The wheels a requirements file pins, downloaded once into folder (again when it changes)."""
    import fcntl
    import shutil
    import subprocess

    stamp = folder / ".requirements"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # make test runs pytest-xdist workers side by side: one downloads, the others wait for it.
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == requirements.read_text():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "-r",
                str(requirements),
                "-d",
                str(folder),
            ],
            check=True,
            timeout=900,
        )
        stamp.write_text(requirements.read_text())
    return folder


@pytest.fixture(scope="session")
def wheelhouse():
    """Wheels of the hosts' download tools: test hosts cannot reach PyPI, the controller can."""
    return downloaded_wheels(
        REPO / "roles" / "weights" / "files" / "requirements-host.txt",
        REPO / "tests" / ".state" / "wheelhouse",
    )


@pytest.fixture(scope="session")
def router_wheelhouse():
    """Wheels of sglang-router and its closure (roles/router/files/requirements-host.txt)."""
    return downloaded_wheels(
        REPO / "roles" / "router" / "files" / "requirements-host.txt",
        REPO / "tests" / ".state" / "wheelhouse-router",
    )


@pytest.fixture(scope="session")
def runtime_wheelhouse(wheelhouse, tmp_path_factory):
    """The hosts' wheelhouse plus the stand-in sglang wheel (tests/support/fake_sglang.py) and
    the build backend a git install of SGLang needs: the runtime role installs from it with
    --no-index."""
    import shutil

    from tests.support.fake_sglang import build_wheel

    build = downloaded_wheels(
        REPO / "tests" / "fixtures" / "requirements-build.txt",
        REPO / "tests" / ".state" / "wheelhouse-build",
    )
    folder = tmp_path_factory.mktemp("runtime-wheelhouse")
    for source in (wheelhouse, build):
        for wheel in source.glob("*.whl"):
            shutil.copy2(wheel, folder)
    build_wheel(folder)
    return folder


# Under pytest-xdist (make test) each worker takes whole files in DEALING_ORDER, then the rest
# in collection order. make test passes --no-loadscope-reorder: xdist would otherwise hand files
# out by their number of tests (the unit files first, the end-to-end deploy after 200 s, a 100 s
# file alone at the end on one of two cores). The figures are make test's own (each file's
# tests' time added up, in the JSON file it writes) and what each file uses alone
# (docs/testing.md): the suite is CPU-bound, so the order is about keeping both cores busy.
# LONGEST_FIRST: the files that take longest, costliest first, so that none starts last.
LONGEST_FIRST = (
    "tests/integration/test_deploy.py",
    "tests/integration/test_weights.py",
    "tests/integration/test_benchmark.py",
    "tests/integration/test_canary.py",
    "tests/integration/test_server.py",
    "tests/integration/test_git_runtime.py",
    "tests/unit/test_analysis.py",
    "tests/unit/test_canary_loaders.py",
    "tests/integration/test_plan.py",
    "tests/unit/test_analysis_predicted.py",
    "tests/integration/test_runtime_rollback.py",
    "tests/unit/test_analysis_fuzz.py",
    "tests/integration/test_preflight.py",
    "tests/integration/test_tuning.py",
    "tests/integration/test_router.py",
    "tests/integration/test_autotune.py",
    "tests/unit/test_controller_lock.py",
    "tests/integration/test_rollout.py",
    "tests/integration/test_launch_check.py",
    "tests/integration/test_settings_check.py",
    "tests/integration/test_diagnose.py",
    "tests/unit/test_make_setup.py",
    "tests/unit/test_canary_checkpoint.py",
    "tests/integration/test_smoke.py",
    "tests/unit/test_analysis_quality.py",
    "tests/unit/test_packaging.py",
    "tests/integration/test_tags.py",
    "tests/unit/test_analysis_latency.py",
    "tests/integration/test_host_lock.py",
)
# Files that mostly wait (the simulator's steps, deadlines, hung peers: a tenth of a core
# each, about 270 s in all), in two halves. The first is dealt right after the two longest
# files and runs while lint takes the other core (make test runs it beside pytest, at a lower
# priority); the second after the costliest files that follow, among which it waits. Dealt
# among the short files at the end, as they were, they left a core idle for the last 400 s of
# the run; dealt all at once after the two longest, two workers ended up waiting together once
# lint was done (a quarter of both cores idle for 100 s).
WAITING_EARLY = (
    "tests/unit/test_sglang_sim.py",
    "tests/unit/test_benchmark.py",
    "tests/unit/test_deadlines.py",
)
WAITING_LATE = (
    "tests/unit/test_weights.py",
    "tests/unit/test_canary.py",
    "tests/unit/test_benchmark_faults.py",
    "tests/unit/test_allreduce_check.py",
    "tests/unit/test_hub_server.py",
    "tests/unit/test_api_check.py",
    "tests/unit/test_benchmark_client.py",
    "tests/unit/test_sim_knobs.py",
)
MOSTLY_WAITING = WAITING_EARLY + WAITING_LATE
DEALING_ORDER = (
    LONGEST_FIRST[:2] + WAITING_EARLY + LONGEST_FIRST[2:7] + WAITING_LATE + LONGEST_FIRST[7:]
)


def pytest_collection_modifyitems(config, items):
    # The workers collect (and order) the tests the controller hands out.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return DEALING_ORDER.index(path) if path in DEALING_ORDER else len(DEALING_ORDER)

    items.sort(key=rank)  # stable: within a rank, collection order
