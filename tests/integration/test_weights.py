"""The weights stage over SSH test hosts, against a local hub serving a generated 240 MiB repo."""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.support.hub_server import LocalHub, Stall, token_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.weights, pytest.mark.integration]

GOOD = "hf_weights_good_93e1a0"
UNAPPROVED = "hf_weights_unapproved_11f4"
BAD = "hf_weights_bad_7c2d"
TARGET = "moonshotai/Kimi-K2.6"
DFLASH = "z-lab/Kimi-K2.6-DFlash"
EVIL = "evil/Kimi-K2.6-DFlash"
LEFTOVER_TOKEN = "hf_leftover_from_a_killed_run_5d1c"
SHARDS = 30
SHARD_BYTES = 8 << 20  # 30 x 8 MiB + small files: 240 MiB in 34 files
WEIGHTS = "/opt/kimi/weights"
# The host the stage's downloads run on, one test after another. The tests that need a host
# without weights empty its weights folder first (wiped()); its tools venv, the stage's fixed
# cost, is made once, by the first run.
SHARED = "fresh"


def wiped(cluster) -> str:
    """The shared host with no weights and no download state: as a fresh host's weights stage
    finds it, bar the tools venv (/opt/kimi/tools-venv) an earlier test's run made."""
    cluster.ssh(SHARED, f"rm -rf {WEIGHTS}")
    return SHARED


def shard_name(index: int) -> str:
    return f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"


@pytest.fixture(scope="module")
def target_files() -> dict[str, bytes]:
    generator = random.Random(20261130)
    files = {shard_name(i): generator.randbytes(SHARD_BYTES) for i in range(SHARDS)}
    files["config.json"] = (REPO / "models/kimi-k2.6/config.json").read_bytes()
    files["tokenizer_config.json"] = b'{"model_max_length": 262144}'
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {}}).encode()
    files["README.md"] = b"# test repository\n"
    return files


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200"], names=[SHARED])
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def hub(cluster, target_files):
    # Listens on the bridge, where the test hosts reach the controller.
    with LocalHub(host=cluster.gateway) as hub:
        hub.valid_tokens |= {GOOD, UNAPPROVED}
        hub.add_repo(TARGET, target_files)
        generator = random.Random(7)
        # A malicious listing: a name that climbs out of the weights folder.
        hub.add_repo(EVIL, {"config.json": b"{}", "../../../escape.txt": b"written outside"})
        hub.add_repo(
            DFLASH,
            {
                "config.json": b'{"block_size": 8}',
                "model.safetensors": generator.randbytes(3 << 20),
            },
            gated=True,
            approved_tokens={GOOD},
        )
        yield hub


def weights(
    playbook, cluster, hub, wheelhouse, secrets: Path, limit: str, token=GOOD, verbosity=0, **extra
):
    extravars = {
        # The controller's record of each host, kept out of the repository's state/.
        "weights_controller_state_dir": str(Path(cluster.state_dir) / "controller-state"),
        "kimi_serving_configs": ["ar", "dflash"],
        "kimi_hf_endpoint": hub.url,
        "weights_wheelhouse": str(wheelhouse),
        "weights_poll_interval": 5,
        "weights_stall_timeout": 4,
        "weights_download_environment": {"HF_HUB_DISABLE_XET": "1"},
        **extra,
    }
    return playbook(
        "playbooks/weights.yml",
        cluster.inventory,
        extravars=extravars,
        envvars=token_env(token, secrets),
        limit=limit,
        verbosity=verbosity,
    )


def fetched_files(hub: LocalHub, since: int = 0, repo: str = TARGET) -> list[str]:
    """Files of one repo whose bodies were requested, from request `since` on."""
    return [r.file for r in hub.fetched()[since:] if r.repo == repo]


def assert_no_token_at_storage(hub: LocalHub) -> None:
    """LFS bodies came from the storage origin the hub redirects to, which never saw a token."""
    storage = hub.at_storage()
    assert storage, "the hub never redirected"
    leaked = [r for r in storage if r.authenticated or r.token_seen]
    assert not leaked, f"token sent to the storage origin: {leaked[:3]}"


def sha256_on_host(cluster, host: str, path: str) -> str:
    return cluster.ssh(host, f"sha256sum {path}").stdout.split()[0]


def host_path(cluster, host: str, path: str) -> Path:
    """A file the host wrote, read through its overlay's upper layer on the controller."""
    hdir = Path(cluster.host(host).state_dir)
    return hdir / "upper" / path.lstrip("/")


def test_download_verify_and_second_run_is_idle(
    playbook, cluster, hub, wheelhouse, tmp_path, target_files
):
    # A controller that died mid-download left the token file behind.
    token_file = f"{WEIGHTS}/.kimi/hf-token"
    cluster.ssh(
        "fresh",
        f"mkdir -p {WEIGHTS}/.kimi && umask 077 && echo {LEFTOVER_TOKEN} > {token_file}",
    )
    # Polled every second and throttled to 4 MiB/s a connection (8 at once: 240 MiB in 7 s or
    # more), so that the download outlasts a poll, which waits for its end, and the polls show
    # progress lines; elsewhere a poll every 5 s is enough.
    hub.bytes_per_second = 4 << 20
    try:
        first = weights(
            playbook, cluster, hub, wheelhouse, tmp_path, "fresh", weights_poll_interval=1
        )
    finally:
        hub.bytes_per_second = 0
    assert first.rc == 0, first.stdout
    said = " ".join(first.stdout.split())  # the callback wraps long messages
    assert f"Removed {token_file}, a Hugging Face token file left on the host" in said
    assert LEFTOVER_TOKEN not in first.stdout
    assert cluster.ssh("fresh", f"test -e {token_file}", check=False).returncode == 1
    # The gated drafter's folder: root and the service group only; the open target's: all.
    modes = cluster.ssh(
        "fresh", f"stat -c '%a %U:%G' {WEIGHTS}/{DFLASH} {WEIGHTS}/{TARGET}"
    ).stdout.split("\n")
    assert modes[:2] == ["750 root:kimi", "755 root:root"], modes
    # The kimi_progress callback printed the status on the polls.
    assert re.search(
        r"\[fresh\] (moonshotai/Kimi-K2\.6: \w+|waiting for the download)", first.stdout
    )
    local = f"{WEIGHTS}/{TARGET}"
    for name in (shard_name(0), shard_name(SHARDS - 1), "config.json"):
        assert (
            sha256_on_host(cluster, "fresh", f"{local}/{name}")
            == hashlib.sha256(target_files[name]).hexdigest()
        )
    manifest = json.loads(host_path(cluster, "fresh", f"{local}/kimi-manifest.json").read_text())
    assert manifest["revision"] == hub.repos[TARGET].sha
    assert set(manifest["files"]) == set(target_files)
    assert all(entry["hash_checked"] for entry in manifest["files"].values())
    assert sorted(fetched_files(hub)) == sorted(target_files)
    # Shards came from the storage origin; the gated drafter was fetched with the token, which
    # went to the hub only.
    assert {r.origin for r in hub.fetched() if r.file.endswith(".safetensors")} == {"storage"}
    assert sorted(fetched_files(hub, repo=DFLASH)) == ["config.json", "model.safetensors"]
    assert any(r.authenticated and r.repo == DFLASH and r.status == 302 for r in hub.requests)
    assert_no_token_at_storage(hub)

    before = len(hub.fetched())
    started = time.monotonic()
    second = weights(playbook, cluster, hub, wheelhouse, tmp_path, "fresh")
    elapsed = time.monotonic() - started
    second.assert_unchanged()
    assert fetched_files(hub, before) == [], "a second run fetched files again"
    checks = second.results("Check on disk the weights of target")["fresh"]
    assert checks["complete"] and checks["hashed"] == 0
    print(f"second run: {elapsed:.1f}s")

    # plan.yml reports what the weights stage recorded, without contacting the host.
    out = tmp_path / "plan"
    plan = playbook(
        "plan.yml",
        cluster.inventory,
        extravars={
            "plan_output_dir": str(out),
            "plan_state_dir": str(Path(cluster.state_dir) / "controller-state"),
            "kimi_serving_configs": ["ar", "dflash"],
        },
        envvars={"HF_ENDPOINT": hub.url, **token_env(GOOD, tmp_path)},
        limit="fresh",
    )
    assert plan.rc == 0, plan.stdout
    planned = json.loads((out / "fresh" / "plan.json").read_text())["repos"]["target"]
    assert planned["bytes_present"] == planned["bytes"] == sum(map(len, target_files.values()))
    assert planned["files"] == len(target_files)


def test_corrupted_and_truncated_files_are_repaired(
    playbook, cluster, hub, wheelhouse, tmp_path, target_files
):
    local = f"{WEIGHTS}/{TARGET}"
    flipped, truncated = shard_name(3), shard_name(7)
    cluster.ssh(
        "fresh",
        f"python3 -c \"f=open('{local}/{flipped}','r+b'); f.seek(12345); b=f.read(1); "
        f'f.seek(12345); f.write(bytes([b[0]^1])); f.close()" && '
        f"truncate -s 1000000 {local}/{truncated} && echo mine > {local}/my-notes.txt",
    )
    before = len(hub.fetched())
    # -vvv prints every remote command line: the token must not be on any of them.
    run = weights(playbook, cluster, hub, wheelhouse, tmp_path, "fresh", verbosity=3)
    assert run.rc == 0, run.stdout
    assert "SSH: EXEC" in run.stdout and GOOD not in run.stdout
    assert sorted(fetched_files(hub, before)) == sorted([flipped, truncated])
    for name in (flipped, truncated):
        assert (
            sha256_on_host(cluster, "fresh", f"{local}/{name}")
            == hashlib.sha256(target_files[name]).hexdigest()
        )
    # A file the user put there is never deleted.
    assert cluster.ssh("fresh", f"cat {local}/my-notes.txt").stdout.strip() == "mine"
    result = run.results("Result of the download of target")["fresh"]
    assert sorted(result["repaired"]) == sorted([flipped, truncated])


@pytest.mark.timeout(900)
def test_killed_download_resumes_without_refetching_completed_files(
    playbook, cluster, hub, wheelhouse, tmp_path, target_files
):
    host = wiped(cluster)
    hub.bytes_per_second = 2 << 20  # per connection: a download that takes a while
    local = f"{WEIGHTS}/{TARGET}"
    try:
        outcome = {}
        thread = threading.Thread(
            target=lambda: outcome.update(
                # Polled every second: the run is killed within seconds and must show
                # progress lines before.
                run=weights(
                    playbook,
                    cluster,
                    hub,
                    wheelhouse,
                    tmp_path / "a",
                    host,
                    weights_poll_interval=1,
                )
            )
        )
        (tmp_path / "a").mkdir()
        thread.start()
        # The playbook's start (the role's venv from the wheelhouse) takes most of a minute
        # on a busy 2-core machine before the first byte moves.
        deadline = time.monotonic() + 300
        complete = []
        while time.monotonic() < deadline:
            listing = cluster.ssh(
                host, f"stat -c '%n %s' {local}/*.safetensors 2>/dev/null", check=False
            ).stdout
            complete = [
                Path(line.split()[0]).name
                for line in listing.splitlines()
                if int(line.split()[1]) == SHARD_BYTES
            ]
            if len(complete) >= 8:
                break
            time.sleep(0.5)
        assert len(complete) >= 8, "the download never got going"
        cluster.ssh(
            host, "pkill -9 -f [w]eights_download; pkill -9 -f [s]napshot_download", check=False
        )
        thread.join(timeout=180)
        first = outcome["run"]
        assert first.rc != 0
        assert "ended without finishing" in first.stdout
        # A throttled download: bytes, rate, ETA and files on the polls.
        assert re.search(
            r"\[fresh\] moonshotai/Kimi-K2\.6: downloading [\d.]+ [KMG]iB of "
            r"[\d.]+ [KMG]iB \([\d.]+%\), [\d.]+ [KMG]iB/s, ETA \S+, files \d+/34",
            first.stdout,
        ), first.stdout[-3000:]
    finally:
        hub.bytes_per_second = 0
    before = len(hub.fetched())
    (tmp_path / "b").mkdir()
    second = weights(playbook, cluster, hub, wheelhouse, tmp_path / "b", host)
    assert second.rc == 0, second.stdout
    refetched = set(fetched_files(hub, before))
    assert not refetched & set(complete), (
        f"completed files fetched again: {refetched & set(complete)}"
    )
    for name in (shard_name(0), shard_name(SHARDS - 1)):
        assert (
            sha256_on_host(cluster, host, f"{local}/{name}")
            == hashlib.sha256(target_files[name]).hexdigest()
        )


def test_stalled_transfer_is_restarted_by_the_watchdog(
    playbook, cluster, hub, wheelhouse, tmp_path, target_files
):
    """The kit's own transfer (xet off), stuck at the storage origin: restarted, it resumes
    there with a Range request from where its partial file ends."""
    host = wiped(cluster)
    stuck = shard_name(5)
    hub.stalls.append(Stall(path=stuck, after_bytes=1 << 20, seconds=60))
    before = len(hub.requests)
    run = weights(playbook, cluster, hub, wheelhouse, tmp_path, host)
    assert run.rc == 0, run.stdout
    log = host_path(cluster, host, f"{WEIGHTS}/.kimi/moonshotai--Kimi-K2.6/download.log")
    text = log.read_text()
    assert "no new bytes for 4s" in text and "restart 1/5 with xet off" in text
    assert (
        sha256_on_host(cluster, host, f"{WEIGHTS}/{TARGET}/{stuck}")
        == hashlib.sha256(target_files[stuck]).hexdigest()
    )
    result = run.results("Result of the download of target")[host]
    assert result["restarts"] == 1 and result["transfers"] == ["http", "http"]
    bodies = [r for r in hub.requests[before:] if r.file == stuck and r.method == "GET"]
    at_storage = [r for r in bodies if r.origin == "storage"]
    assert [r.range for r in at_storage] == [None, f"bytes={1 << 20}-"]
    assert at_storage[-1].status == 206
    assert_no_token_at_storage(hub)


def test_default_path_switches_to_plain_http_after_a_stall(
    playbook, cluster, hub, wheelhouse, tmp_path, target_files
):
    """The xet setting left alone: huggingface_hub downloads (over HTTP, the hub offers no
    xet) and, stuck at the storage origin, is replaced by the kit's own transfer."""
    host = wiped(cluster)
    stuck = shard_name(11)
    hub.stalls.append(Stall(path=stuck, after_bytes=1 << 20, seconds=60))
    before = len(hub.requests)
    run = weights(
        playbook,
        cluster,
        hub,
        wheelhouse,
        tmp_path,
        host,
        # No HF_HUB_DISABLE_XET. huggingface_hub's own read timeout (10 s) is lengthened so
        # that the hang outlasts the watchdog's 4 s, as the xet stalls at 0 B/s did.
        weights_download_environment={"HF_HUB_DOWNLOAD_TIMEOUT": "120"},
    )
    assert run.rc == 0, run.stdout
    result = run.results("Result of the download of target")[host]
    assert result["restarts"] == 1 and result["transfers"] == ["hub", "http"]
    drafter = run.results("Result of the download of dflash")[host]
    assert drafter["restarts"] == 0 and drafter["transfers"] == ["hub"]
    log = host_path(cluster, host, f"{WEIGHTS}/.kimi/moonshotai--Kimi-K2.6/download.log")
    text = log.read_text()
    assert text.index("transfer: hub") < text.index("no new bytes for 4s")
    assert text.index("no new bytes for 4s") < text.index("transfer: http")
    for name in (stuck, shard_name(0), "config.json"):
        assert (
            sha256_on_host(cluster, host, f"{WEIGHTS}/{TARGET}/{name}")
            == hashlib.sha256(target_files[name]).hexdigest()
        )
    leftovers = cluster.ssh(
        host, f"find {WEIGHTS}/{TARGET} -name '*.incomplete'", check=False
    ).stdout
    assert leftovers.strip() == ""
    bodies = [
        r
        for r in hub.requests[before:]
        if r.file == stuck and r.method == "GET" and r.origin == "storage"
    ]
    agents = [r.headers.get("user-agent") or r.headers.get("User-Agent") or "" for r in bodies]
    assert "hf_hub/" in agents[0] and agents[-1].startswith("Python-urllib/")
    assert_no_token_at_storage(hub)


def test_disk_full_says_free_and_needed(playbook, cluster, hub, wheelhouse, tmp_path):
    host = wiped(cluster)
    # The weights folder on a 150 MiB file system of its own: 240 MiB do not fit. Unmounted
    # after, it leaves the host as wiped() does (the stage's state lives in that folder).
    cluster.ssh(host, f"mkdir -p {WEIGHTS} && mount -t tmpfs -o size=150m tmpfs {WEIGHTS}")
    try:
        run = weights(playbook, cluster, hub, wheelhouse, tmp_path, host)
    finally:
        cluster.ssh(host, f"umount -l {WEIGHTS}")
    assert run.rc != 0
    assert "not enough disk space for moonshotai/Kimi-K2.6" in run.stdout
    assert "GiB free" in run.stdout and "GiB still needed" in run.stdout


@pytest.mark.parametrize(
    ("token", "extra", "expected"),
    [
        (UNAPPROVED, {}, "the token's account has no approved access"),
        (BAD, {}, "the Hugging Face token was rejected as invalid"),
        (GOOD, {"kimi_target_revision": "0" * 40}, "does not exist in moonshotai/Kimi-K2.6"),
    ],
    ids=["gated-without-access", "bad-token", "missing-revision"],
)
def test_access_problems(playbook, cluster, hub, wheelhouse, tmp_path, token, extra, expected):
    run = weights(playbook, cluster, hub, wheelhouse, tmp_path, "fresh", token=token, **extra)
    assert run.rc != 0
    assert expected in run.stdout
    assert token not in run.stdout


def test_a_malicious_listing_is_refused_before_the_host_is_touched(
    playbook, cluster, hub, wheelhouse, tmp_path
):
    """A hub listing `../../../escape.txt` for the drafter: the stage fails naming the entry,
    the hub, the repository and the revision, and nothing lands outside the weights folder."""
    run = weights(playbook, cluster, hub, wheelhouse, tmp_path, "fresh", kimi_dflash_repo=EVIL)
    assert run.rc != 0
    assert "unsafe file path '../../../escape.txt'" in run.stdout
    assert f"the hub at {hub.url}" in run.stdout and f"{EVIL}@main" in run.stdout
    assert fetched_files(hub, repo=EVIL) == []
    found = cluster.ssh("fresh", "find /opt /root /tmp -name escape.txt 2>/dev/null", check=False)
    assert found.stdout.strip() == ""


def test_token_appears_nowhere(cluster, tmp_path_factory):
    """Everything the hosts wrote (weights, manifests, logs, async results) and the runner's
    own files (events, artifacts) hold no token."""
    roots = [Path(h.state_dir) for h in cluster.hosts] + [tmp_path_factory.getbasetemp()]
    tokens = (GOOD, UNAPPROVED, BAD)
    # One pass over the hosts' files (240 MiB of weights each), then which token each file holds.
    found = subprocess.run(
        ["grep", "-rlF", "--exclude=hf-token", *(f"-e{t}" for t in tokens), *map(str, roots)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    holding = {
        token: [f for f in found.stdout.splitlines() if token.encode() in Path(f).read_bytes()]
        for token in tokens
    }
    assert found.stdout == "", f"found in: {holding}"


LOCKED = "study/locked-model"


def test_a_deploy_from_the_study_lock_gets_the_locked_bytes_after_main_moved(
    playbook, cluster, hub, wheelhouse, tmp_path
):
    """plan.yml locks main's commit; main then moves on at the hub; the weights stage on a host
    without weights, following the lock, downloads the locked commit's bytes, not main's."""
    host = wiped(cluster)
    first_files = {
        "config.json": (REPO / "models/kimi-k2.6/config.json").read_bytes(),
        "model.safetensors": random.Random(1).randbytes(2 << 20),
    }
    first = hub.add_repo(LOCKED, first_files)
    lock_path = tmp_path / "kimi.lock.yml"
    settings = {
        "kimi_target_repo": LOCKED,
        "kimi_serving_configs": ["ar"],
        "kimi_lock_file": str(lock_path),
    }
    plan = playbook(
        "plan.yml",
        cluster.inventory,
        extravars={
            **settings,
            "plan_output_dir": str(tmp_path / "plan"),
            "kimi_hf_endpoint": hub.url,
        },
        envvars=token_env(GOOD, tmp_path),
        limit=host,
    )
    assert plan.rc == 0, plan.stdout
    lock = yaml.safe_load(lock_path.read_text())
    assert lock["weights"][LOCKED]["requested"] == "main"
    assert lock["weights"][LOCKED]["revision"] == first.sha

    moved_files = {**first_files, "model.safetensors": random.Random(2).randbytes(2 << 20)}
    moved = hub.add_repo(LOCKED, moved_files)
    assert moved.sha != first.sha and hub.repos[LOCKED].resolve("main") == moved.sha
    locked_bytes = lock_path.read_bytes()
    run = weights(playbook, cluster, hub, wheelhouse, tmp_path, host, **settings)
    assert run.rc == 0, run.stdout
    said = run.results("Say which study lock the run follows")[host]["msg"]
    assert f"Following the study lock {lock_path}" in said and f"{LOCKED}@{first.sha}" in said
    local = f"{WEIGHTS}/{LOCKED}"
    manifest = json.loads(host_path(cluster, host, f"{local}/kimi-manifest.json").read_text())
    assert manifest["revision"] == first.sha
    for name, data in first_files.items():
        assert sha256_on_host(cluster, host, f"{local}/{name}") == hashlib.sha256(data).hexdigest()
    assert lock_path.read_bytes() == locked_bytes
