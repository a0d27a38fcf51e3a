"""diagnose.yml over SSH test hosts: one support bundle of a host with every source in place, a
broken host and a host that is not there.

The hosts are seeded over SSH with the files the stages would leave (no deploy: the bundle only
reads them), each holding an API key and an HF token the controller knows and a key and token
only the host knows (its secrets file, a token file an interrupted weights run left), with
their unkeyed digests and base64 forms, and file names made of them:

- `diag-good` (systemd as PID 1, root): every source the bundle reads, a fake runtime whose pip
  freeze and check_env print the secrets, a fake dmesg, a fake fabric manager, hostile links
  in the canary logs folder.
- `diag-broken` (sshd as PID 1, reached as the sudo user): nvidia-smi hangs (the fake's `hang`
  fault), no runtime, the server's log a FIFO, a dmesg that prints without end, a launch record
  that is not JSON, the canary logs folder a link to /etc.
- `diag-gone`: in the inventory, nothing at its address.
- `diag-nopython`: the good host again under another name, with a Python that does not exist:
  its collection fails as a whole.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from tests.support import host_bytecode
from tests.support.ansible_run import run_playbook
from tests.support.archives import extract_files, read_members
from tests.support.diagnose_plant import SCRUBBED_SOURCES, SECRET_NAMED_LOG, forms, planted
from tests.support.hostprep import install_fabricmanager
from tests.support.secret_scan import derived_forms, scan

pytestmark = [pytest.mark.diagnose, pytest.mark.integration]

GOOD = "diag-good"
BROKEN = "diag-broken"
GONE = "diag-gone"
NOPYTHON = "diag-nopython"
API_KEY = "sk-diag-ctrl-7f3a9b2c4d5e6f"
HF_TOKEN = "hf_CtrlTokenAbCdEfGhIjKlMnOpQrStUvWx12"
HOST_KEY = "hostonly-key-0e1d2c3b4a5968"
HOST_TOKEN = "hf_HostTokenZyXwVuTsRqPoNmLkJiHgFeDc98"
SECRETS = {"api key": API_KEY, "hf token": HF_TOKEN, "host key": HOST_KEY, "host token": HOST_TOKEN}
COMMAND_TIMEOUT_S = 3
# What the broken host's dmesg prints without end.
FLOOD = "[ 1.0] NVRM: Xid 79 flood"
COLLECT = "Collect the host's state, secrets scrubbed"
WHERE = "Say where the bundle is"
MASK = b"********"
# Files a login or Ansible itself changes on any host, whatever the playbook does.
NOT_OURS = (
    "root/.ansible",
    "home/kimiops/.ansible",
    "var/log/journal",
    "var/log/wtmp",
    "var/log/btmp",
    "var/log/lastlog",
    # The test harness's bytecode cache (tests/support/host_bytecode.py).
    host_bytecode.CACHE_DIR.lstrip("/"),
)


def planted_all() -> str:
    """Every secret in every form (the host-only key matches no pattern: only knowing it masks
    it)."""
    return planted(SECRETS.values())


def record(**extra) -> str:
    return json.dumps(
        {
            "argv": ["python", "-m", "sglang.launch_server", "--api-key", API_KEY],
            "environment": {"HF_TOKEN": HF_TOKEN, "NOTE": f"rotated from {HOST_KEY}"},
            "note": planted_all(),
            **extra,
        },
        indent=1,
    )


FAKE_PYTHON = """#!/bin/sh
# A runtime's python for the bundle: pip freeze and check_env that print secrets.
case "$*" in
  "-m pip freeze"*)
    printf 'sglang==0.5.23\\nprivate @ https://ops:{hf}@wheels.example/p.whl\\n%s' "$PLANTED";;
  "-m sglang.check_env"*) printf 'Python: 3.12\\nsglang: 0.5.23\\nHF_TOKEN: {hf}\\n%s' "$PLANTED";;
  *) echo "fake python: $*" >&2; exit 2;;
esac
"""


def tar_of(entries: list[tuple]) -> bytes:
    """A tar of (path, kind, data-or-target, mode) to unpack at a host's /."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, kind, data, mode in entries:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mode = mode
            if kind == "file":
                raw = data.encode() if isinstance(data, str) else data
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buffer.getvalue()


def unpack(cluster, host: str, entries: list[tuple]) -> None:
    data = base64.b64encode(tar_of(entries)).decode()
    cluster.ssh(host, "base64 -d | tar -xzf - -C / --no-same-owner", input=data, timeout=60)


def good_host_files() -> list[tuple]:
    planted_sh = planted_all().replace("'", "")
    python = FAKE_PYTHON.format(hf=HF_TOKEN).replace(
        "#!/bin/sh\n", f"#!/bin/sh\nPLANTED='{planted_sh}'\n", 1
    )
    log = (
        f"server_args=ServerArgs(model_path='/opt/kimi/weights/x', api_key='{API_KEY}')\n"
        + "".join(f"[2026-01-01] INFO step {n}\n" for n in range(2000))
        + f"Authorization: Bearer {API_KEY}\nHF_TOKEN={HF_TOKEN}\n"
        + planted_all()
    )
    dmesg = "#!/bin/sh\n" + "".join(
        f"echo '[ 12.5] NVRM: Xid (PCI:0000:17:00): 79, pid=4242, {form}'\n"
        for s in SECRETS.values()
        for form in forms(s)
    )
    dmesg += "echo '[ 13.0] eth0: link up'\n"
    return [
        ("/var/log/kimi", "dir", None, 0o700),
        ("/var/log/kimi/sglang.log", "file", log, 0o600),
        ("/var/lib/kimi/server/launch.json", "file", record(manager="systemd"), 0o644),
        ("/var/lib/kimi/server/api-check.json", "file", record(passed=True), 0o644),
        ("/opt/kimi/runtime/runtime.json", "file", record(release={"version": "0.5.23"}), 0o644),
        ("/opt/kimi/runtime/versions.json", "file", record(history=[]), 0o644),
        ("/opt/kimi/canary/canary.json", "file", record(first_error=f"401 {API_KEY}"), 0o644),
        ("/var/lib/kimi/preflight.json", "file", record(checks={"disk": "ok"}), 0o644),
        ("/var/lib/kimi/tuning-state.json", "file", record(changed={}), 0o600),
        ("/var/lib/kimi/acs-report.json", "file", record(bridges=[]), 0o644),
        ("/etc/nccl.conf", "file", f"NCCL_P2P_DISABLE=1\n# {API_KEY} {HF_TOKEN}\n", 0o644),
        ("/etc/kimi/sglang-secrets.yaml", "file", f"api_key: {HOST_KEY}\n", 0o600),
        (
            "/etc/kimi/kimi-sglang.env",
            "file",
            f'HF_TOKEN="{HF_TOKEN}"\nKIMI_SERVER_API_KEY="{API_KEY}"\nNCCL_P2P_DISABLE="1"\n'
            f'NOTE="{HOST_TOKEN}"\n',
            0o600,
        ),
        # A token file an interrupted weights run left behind: the only place HOST_TOKEN is
        # named, so only reading it masks it.
        ("/opt/kimi/weights/.kimi/hf-token", "file", HOST_TOKEN + "\n", 0o600),
        ("/opt/kimi/canary/logs/dflash.log", "file", "canary start\n" + planted_all(), 0o600),
        (f"/opt/kimi/canary/logs/{API_KEY}.log", "file", "named after the key\n", 0o600),
        ("/opt/kimi/canary/logs/evil.log", "link", "/etc/shadow", 0o777),
        ("/opt/kimi/canary/logs/up.log", "link", "../../../../etc/passwd", 0o777),
        # du names it.
        (f"/opt/kimi/{HOST_TOKEN}", "dir", None, 0o755),
        ("/opt/kimi/runtimes/release-fake/bin/python", "file", python, 0o755),
        ("/opt/kimi/venv", "link", "runtimes/release-fake", 0o777),
        ("/usr/local/bin/dmesg", "file", dmesg, 0o755),
    ]


def broken_host_files() -> list[tuple]:
    return [
        ("/etc/fake-nvidia-smi/fault", "file", "hang\n", 0o644),
        ("/var/log/kimi", "dir", None, 0o700),
        ("/var/log/kimi/sglang.log", "fifo", None, 0o600),
        ("/var/lib/kimi/server/launch.json", "file", f"not json {{ {API_KEY}\n", 0o644),
        ("/opt/kimi/canary/logs", "link", "/etc", 0o777),
        ("/usr/local/bin/dmesg", "file", f"#!/bin/sh\nexec yes '{FLOOD}'\n", 0o755),
    ]


def snapshot(cluster) -> dict[str, tuple]:
    """Every file and link the hosts' own layers hold (what a run could change on them), read
    from this machine, with its size, time, mode and content digest."""
    found = {}
    for host in cluster.hosts:
        upper = Path(host.state_dir) / "upper"
        for folder, dirs, files in os.walk(upper):
            here = Path(folder)
            dirs[:] = [d for d in dirs if str((here / d).relative_to(upper)) not in NOT_OURS]
            for name in files:
                path = here / name
                rel = str(path.relative_to(upper))
                if rel in NOT_OURS:
                    continue
                info = path.lstat()
                digest = (
                    hashlib.sha256(path.read_bytes()).hexdigest()
                    if stat.S_ISREG(info.st_mode)
                    else os.readlink(path)
                    if stat.S_ISLNK(info.st_mode)
                    else ""
                )
                found[f"{host.name}:{rel}"] = (info.st_size, info.st_mtime_ns, info.st_mode, digest)
    return found


def work_folders(cluster) -> list[str]:
    """The collection's work folders left in the hosts' /tmp."""
    return [
        f"{host.name}:{entry.name}"
        for host in cluster.hosts
        for entry in (Path(host.state_dir) / "tmp").iterdir()
        if entry.name.startswith("kimi-diagnose.")
    ]


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200", "ct200"], names=[GOOD, BROKEN], systemd=[GOOD])
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def seeded(cluster, tmp_path_factory):
    """The hosts seeded; the inventory with the sudo user on BROKEN and GONE added; the
    controller's secrets in a vars file (never in ansible-runner's extravars file)."""
    unpack(cluster, GOOD, good_host_files())
    install_fabricmanager(cluster, GOOD)
    unpack(cluster, BROKEN, broken_host_files())
    inventory = cluster.write_inventory(sudo_user_hosts=[BROKEN])
    data = yaml.safe_load(inventory.read_text())
    gone = cluster.subnet.rsplit(".", 1)[0] + ".250"
    hosts = data["all"]["children"]["gpu_hosts"]["children"]["ct200"]["hosts"]
    hosts[GONE] = {"ansible_host": gone}
    hosts[NOPYTHON] = {
        "ansible_host": cluster.host(GOOD).address,
        "ansible_python_interpreter": "/nonexistent/python3",
    }
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    folder = tmp_path_factory.mktemp("diagnose")
    secrets = folder / "secrets.yml"
    secrets.write_text(yaml.safe_dump({"kimi_server_api_key": API_KEY, "kimi_hf_token": HF_TOKEN}))
    secrets.chmod(0o600)
    return {
        "inventory": inventory,
        "secrets": secrets,
        "out": folder / "bundles",
        "folder": folder,
        "before": snapshot(cluster),
    }


def diagnose(seeded, name: str, check: bool = False, **extra):
    private = seeded["folder"] / f"runner-{name}"
    private.mkdir()
    started = time.monotonic()
    run = run_playbook(
        "diagnose.yml",
        seeded["inventory"],
        private,
        extravars={
            "diagnose_output_dir": str(seeded["out"]),
            "diagnose_run_id": name,
            "diagnose_command_timeout_s": COMMAND_TIMEOUT_S,
            "diagnose_check_env_timeout_s": 10,
            "diagnose_timeout_s": 120,
            **extra,
        },
        vars_files=[seeded["secrets"]],
        check=check,
    )
    run.seconds = time.monotonic() - started
    return run


@pytest.fixture(scope="module")
def first(seeded):
    run = diagnose(seeded, "first")
    bundle = seeded["out"] / "first.tar.gz"
    return run, bundle


def host_items(members: dict[str, bytes], run: str, host: str) -> dict[str, dict]:
    manifest = json.loads(members[f"{run}/{host}/manifest.json"])
    return {item["name"]: item for item in manifest["items"]}


def test_the_bundle_names_every_host_and_the_play_succeeds(first, cluster):
    run, bundle = first
    assert run.rc == 0 and not run.failed_hosts(), run.stdout[-6000:]
    print(f"\ndiagnose.yml over 4 hosts took {run.seconds:.1f} s")
    where = run.results(WHERE)
    assert len(where) == 1
    message = next(iter(where.values()))["msg"]
    assert str(bundle) in message and "Unreachable: diag-gone." in message
    assert "Collection failed: diag-nopython" in message
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600
    assert stat.S_IMODE(bundle.parent.stat().st_mode) == 0o700
    members = read_members(bundle)
    with tarfile.open(bundle) as tar:
        for info in tar.getmembers():
            print(f"{info.size:>9} {info.name}")
            assert info.isreg() and not info.name.startswith("/") and ".." not in info.name
            assert info.name.startswith("first/")
    index = json.loads(members["first/index.json"])
    assert {h: e["state"] for h, e in index["hosts"].items()} == {
        GOOD: "collected",
        BROKEN: "collected",
        GONE: "unreachable",
        NOPYTHON: "failed",
    }
    assert index["unreachable"] == [GONE] and index["failed"] == [NOPYTHON]
    assert "interpreter '/nonexistent/python3' was not found" in index["hosts"][NOPYTHON]["why"]
    # ssh's own words for an address nothing answers: "No route to host" once ARP gives up,
    # or, when its connection was already being set up, Ansible's "could not be sent" (seen
    # on a loaded machine).
    why = index["hosts"][GONE]["why"]
    assert "No route to host" in why or "Make sure this host can be reached over SSH" in why, why
    # The work folders went, and the controller's staging folder with them.
    assert work_folders(cluster) == []
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["first.tar.gz"]


def test_no_secret_or_derived_form_is_in_the_bundle_or_the_runs_output(first, tmp_path):
    run, bundle = first
    folder = tmp_path / "extracted"
    extract_files(bundle, folder)
    needles = {label: derived_forms(value) for label, value in SECRETS.items()}
    leaks, read = scan([folder], needles, readable_only=False)
    assert read > 40
    assert not leaks, [str(leak) for leak in leaks]
    # Nor in what the run printed or ansible-runner recorded.
    leaks, read = scan([run.private_dir / "artifacts"], needles, readable_only=False)
    assert read > 0 and not leaks, [str(leak) for leak in leaks]


def test_every_source_of_the_good_host_is_there_scrubbed_not_dropped(first):
    _, bundle = first
    members = read_members(bundle)
    top = f"first/{GOOD}"
    masked = [*SCRUBBED_SOURCES, "disk/du-opt-kimi.txt"]
    for name in masked:
        assert MASK in members[f"{top}/{name}"], name
    plain = [
        "gpu/nvidia-smi-q.txt",
        "gpu/nvidia-smi-topo-m.txt",
        "kernel/uname.txt",
        "kernel/cmdline.txt",
        "services/nvidia-fabricmanager.txt",
        "services/nv-fabricmanager-version.txt",
        "disk/statvfs.json",
        SECRET_NAMED_LOG,
    ]
    for name in plain:
        assert members[f"{top}/{name}"].strip(), name
    log = members[f"{top}/server/sglang.log"].decode()
    assert len(log.splitlines()) == 500 and "INFO step 1999" in log
    assert members[f"{top}/server/sglang-secrets.yaml"] == b"api_key: ********\n"
    assert b"NCCL_P2P_DISABLE=1" in members[f"{top}/nccl/nccl.conf"]
    assert b"NVRM: Xid" in members[f"{top}/kernel/dmesg-nvrm-xid.txt"]
    assert b"eth0" not in members[f"{top}/kernel/dmesg-nvrm-xid.txt"]
    assert b"GPU 00000000" in members[f"{top}/gpu/nvidia-smi-q.txt"]
    assert b"sglang==0.5.23" in members[f"{top}/runtime/release/pip-freeze.txt"]
    assert b"inactive" in members[f"{top}/services/nvidia-fabricmanager.txt"]
    items = host_items(members, "first", GOOD)
    for link in ("canary/logs/evil.log", "canary/logs/up.log"):
        assert items[link]["status"] == "failed" and "a link" in items[link]["why"]
        assert f"{top}/{link}" not in members
    assert items["runtime/git/pip-freeze.txt"]["status"] == "absent"
    manifest = json.loads(members[f"{top}/manifest.json"])
    assert manifest["systemd"] is True
    assert "/opt/kimi/weights/.kimi/hf-token" in manifest["secrets_from"]
    assert any("token file is on the host" in note for note in manifest["notes"])


def test_the_broken_host_is_collected_and_each_failed_step_recorded(first, cluster):
    _, bundle = first
    members = read_members(bundle)
    items = host_items(members, "first", BROKEN)
    smi = items["gpu/nvidia-smi-q.txt"]
    assert smi["status"] == "timed_out" and smi["source"] == "nvidia-smi -q"
    assert COMMAND_TIMEOUT_S - 0.1 < smi["seconds"] < COMMAND_TIMEOUT_S + 5
    assert smi["rc"] < 0 and "killed with its process group" in smi["why"]
    assert items["gpu/nvidia-smi-topo-m.txt"]["status"] == "not_run"
    for kind in ("release", "git"):
        for name in ("pip-freeze.txt", "check-env.txt"):
            entry = items[f"runtime/{kind}/{name}"]
            assert entry["status"] == "absent" and "does not exist" in entry["why"]
    assert items["server/sglang.log"] == {**items["server/sglang.log"], "status": "failed"}
    assert items["server/sglang.log"]["why"] == "not a regular file"
    dmesg = items["kernel/dmesg-nvrm-xid.txt"]
    assert dmesg["status"] == "cut" and "printed more than" in dmesg["why"]
    assert items["canary/logs"]["status"] == "failed" and "link" in items["canary/logs"]["why"]
    assert "not JSON" in items["records/launch.json"]["why"]
    assert MASK in members[f"first/{BROKEN}/records/launch.json"]
    # Nothing of the hung nvidia-smi is left running on the host.
    left = cluster.ssh(BROKEN, "pgrep -f fake-nvidia-smi-hang", check=False)
    assert left.returncode == 1, left.stdout
    manifest = json.loads(members[f"first/{BROKEN}/manifest.json"])
    assert manifest["systemd"] is False


def test_a_second_run_changes_nothing_on_the_hosts(first, seeded, cluster):
    run = diagnose(seeded, "second")
    assert run.rc == 0 and not run.failed_hosts(), run.stdout[-6000:]
    print(f"\nsecond diagnose.yml took {run.seconds:.1f} s")
    assert (seeded["out"] / "second.tar.gz").is_file()
    after = snapshot(cluster)
    before = seeded["before"]
    # It did look: the seeded files are in it.
    assert f"{GOOD}:var/log/kimi/sglang.log" in before and f"{BROKEN}:etc/nccl.conf" not in before
    assert f"{GOOD}:etc/kimi/sglang-secrets.yaml" in before
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == [], changed
    assert work_folders(cluster) == []


def test_check_mode_collects_but_writes_no_bundle(first, seeded, cluster):
    run = diagnose(seeded, "checked", check=True)
    assert run.rc == 0 and not run.failed_hosts(), run.stdout[-6000:]
    message = next(iter(run.results(WHERE).values()))["msg"]
    assert message.startswith("Check mode") and "checked.tar.gz" in message
    assert not (seeded["out"] / "checked.tar.gz").exists()
    assert not any(p.name.startswith(".") for p in seeded["out"].iterdir())
    assert work_folders(cluster) == []


def test_an_output_folder_that_cannot_be_written_stops_before_any_host(seeded, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = diagnose(seeded, "blocked", diagnose_output_dir=str(blocker / "bundles"))
    assert run.rc != 0
    assert "Not a directory" in run.stdout and "Fix:" in run.stdout
    assert run.results(COLLECT) == {}
