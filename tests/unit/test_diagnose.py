"""The support bundle's logic (module_utils/diagnose/) on this machine, without test
hosts: a
hung command is killed at its deadline, an endless one at its cap, a missing one recorded;
every secret is scrubbed (file names included, and their digest and base64 forms); member names
stay safe on the host and on the controller, whatever a hostile host archive holds; caps hold;
a link in a collected folder is never followed."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from ansible.module_utils.diagnose.collect import Collection, collect
from ansible.module_utils.diagnose.collector import STDERR_MAX
from ansible.module_utils.diagnose.files import env_file_values, secrets_file_values
from ansible.module_utils.diagnose.members import BadInput, safe_part, valid_member
from ansible.module_utils.diagnose.pack import (
    MANIFEST_MAX,
    build_bundle,
    prepare_output,
    read_host_archive,
)
from ansible.module_utils.host.secret_scrub import Scrubber

from tests.support.archives import extract_files, read_members
from tests.support.diagnose_plant import SCRUBBED_SOURCES, SECRET_NAMED_LOG, forms, planted
from tests.support.modules import marked_processes, run_module
from tests.support.secret_scan import derived_forms, scan

pytestmark = pytest.mark.diagnose

API_KEY = "sk-diag-unit-5c1e9a7b3d"
HF_TOKEN = "hf_UnitTokenAbCdEfGhIjKlMnOpQrStUv0123"
HOST_KEY = "hostkey-unit-8d7c6b5a4f"
HOST_TOKEN = "hf_HostUnitTokenZyXwVuTsRqPoNmLk98765"
ALL = (API_KEY, HF_TOKEN, HOST_KEY, HOST_TOKEN)
# Killing a group and reaping it, with room for two loaded cores.
MARGIN_S = 3.0

HANG = """#!{python}
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
    {marker!r}])
time.sleep(60)
"""


def program(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def params(tmp_path: Path, **over) -> dict:
    root = tmp_path / "host"
    work = tmp_path / "work"
    for folder in (root, work):
        folder.mkdir(parents=True, exist_ok=True)
    missing = str(root / "missing-tool")
    p = {
        "host": "unit-host",
        "secrets": [API_KEY, HF_TOKEN],
        "work_dir": str(work),
        "pythons": {},
        "log_file": str(root / "sglang.log"),
        "secrets_file": str(root / "secrets.yaml"),
        "env_file": str(root / "kimi-sglang.env"),
        "token_files": [str(root / "hf-token")],
        "server_state_dir": str(root / "server"),
        "runtime_state_dir": str(root / "runtime"),
        "canary_dir": str(root / "canary"),
        "preflight_record": str(root / "preflight.json"),
        "nccl_conf": str(root / "nccl.conf"),
        "tuning_state": str(root / "tuning-state.json"),
        "acs_report": str(root / "acs-report.json"),
        "disk_paths": [str(root)],
        "unit_name": "kimi-sglang",
        "fabricmanager_service": "nvidia-fabricmanager",
        "persistenced_service": "nvidia-persistenced",
        # Tools a test does not give are absent from the host.
        "nvidia_smi": missing,
        "systemctl": missing,
        "pgrep": missing,
        "dmesg": missing,
        "du": "du",
        "fabricmanager_binary": missing,
        "timeout": 60,
        "command_timeout": 20,
        "check_env_timeout": 20,
        "du_timeout": 20,
        "max_item_bytes": 1 << 20,
        "max_host_bytes": 8 << 20,
        "log_lines": 50,
        "dmesg_lines": 100,
    }
    p.update(over)
    return p


def manifest(archive: str) -> dict:
    return json.loads(read_members(archive)["manifest.json"])


def items(archive: str) -> dict[str, dict]:
    return {item["name"]: item for item in manifest(archive)["items"]}


def assert_no_secret(folder: Path) -> None:
    leaks, read = scan(
        [folder], {f"secret {n}": derived_forms(s) for n, s in enumerate(ALL)}, readable_only=False
    )
    assert read > 0
    assert not leaks, [str(leak) for leak in leaks]


def extract(archive: str, into: Path) -> Path:
    into.mkdir()
    extract_files(archive, into)
    return into


# -- names ---------------------------------------------------------------------------------


def test_safe_part_and_member_names_refuse_what_could_escape():
    assert safe_part("gpu-node-17") == "gpu-node-17"
    assert safe_part("..") == "_.."
    assert safe_part(".hidden") == "_.hidden"
    assert safe_part("-rf") == "_-rf"
    assert safe_part("a/../../etc") == "a_.._.._etc"
    assert safe_part("") == "_"
    assert safe_part("x" * 500) == "x" * 127
    for good in ("manifest.json", "gpu/nvidia-smi-q.txt", "run/host/kernel/uname.txt"):
        assert valid_member(good)
    for bad in (
        "/etc/passwd",
        "../x",
        "a/../b",
        "a/./b",
        "a//b",
        "",
        ".hidden",
        "-option",
        "a/b/c/d/e/f/g",
        "tab\tname",
        "new\nline",
        "x" * 600,
    ):
        assert not valid_member(bad), bad


# -- commands ------------------------------------------------------------------------------


def test_a_hung_command_is_killed_at_its_deadline_and_not_run_again(tmp_path):
    marker = f"diag-hang-{uuid.uuid4().hex}"
    hang = program(tmp_path, "nvidia-smi", HANG.format(python=sys.executable, marker=marker))
    run = Collection(params(tmp_path, nvidia_smi=hang, command_timeout=1.5))
    run.learn_secrets()
    started = time.monotonic()
    run.gpus()
    elapsed = time.monotonic() - started
    assert elapsed < 1.5 + MARGIN_S
    assert marked_processes(marker, settle_s=2.0) == []
    first, second = run.items
    # Killed: a signal as its exit (SIGTERM, or SIGKILL for one that ignored it).
    assert first["status"] == "timed_out" and first["rc"] < 0
    assert first["source"] == f"{hang} -q"
    assert 1.4 < first["seconds"] < 1.5 + MARGIN_S
    assert "killed with its process group" in first["why"]
    # topo -m would hang the same way: recorded, not run.
    assert second["status"] == "not_run" and "hung earlier" in second["why"]


def test_after_a_hung_gpu_check_env_gets_the_command_deadline_and_pythons_count_apart(tmp_path):
    """check_env asks CUDA, which hangs where nvidia-smi hung: it gets the command deadline,
    not its own. A python that hung is not run again; another one of the same name is."""
    marker = f"diag-hang-{uuid.uuid4().hex}"
    body = HANG.format(python=sys.executable, marker=marker)
    hang = program(tmp_path, "hang", body)
    for kind in ("release", "git"):
        (tmp_path / kind).mkdir()
    # The release python hangs in check_env only, and then again in anything after it.
    release = f'#!/bin/sh\ncase "$*" in *check_env*) exec {hang};; *) echo fine;; esac\n'
    run = Collection(
        params(
            tmp_path,
            nvidia_smi=program(tmp_path, "nvidia-smi", body),
            pythons={
                "git": program(tmp_path / "git", "python", body),
                "release": program(tmp_path / "release", "python", release),
            },
            command_timeout=1,
            check_env_timeout=60,
        )
    )
    run.learn_secrets()
    started = time.monotonic()
    run.gpus()
    run.runtimes()
    assert time.monotonic() - started < 2 * (1 + MARGIN_S)
    assert marked_processes(marker, settle_s=2.0) == []
    by_name = {item["name"]: item for item in run.items}
    # The git python hung in pip freeze: its check_env is not run.
    assert by_name["runtime/git/pip-freeze.txt"]["status"] == "timed_out"
    assert by_name["runtime/git/check-env.txt"]["status"] == "not_run"
    # The release python, of the same name, runs; its check_env hangs and is killed at the
    # command deadline (1 s), not check_env's (60 s).
    assert by_name["runtime/release/pip-freeze.txt"]["status"] == "ok"
    check_env = by_name["runtime/release/check-env.txt"]
    assert check_env["status"] == "timed_out" and check_env["seconds"] < 1 + MARGIN_S


def test_the_collections_deadline_stops_what_is_left(tmp_path):
    marker = f"diag-hang-{uuid.uuid4().hex}"
    body = HANG.format(python=sys.executable, marker=marker)
    run = Collection(
        params(tmp_path, nvidia_smi=program(tmp_path, "a", body), timeout=1, command_timeout=30)
    )
    run.learn_secrets()
    run.gpus()
    run.command("x/late.txt", ["true"])
    assert run.items[0]["status"] == "timed_out"
    assert run.items[-1]["status"] == "not_run"
    assert "timeout ran out" in run.items[-1]["why"]
    assert marked_processes(marker, settle_s=2.0) == []


def test_a_command_that_prints_without_end_is_killed_at_the_cap(tmp_path):
    endless = program(tmp_path, "endless", "#!/bin/sh\nexec yes 'NVRM: Xid 79 again'\n")
    flood = program(tmp_path, "flood", "#!/bin/sh\nexec yes 'stderr flood' >&2\n")
    run = Collection(params(tmp_path, max_item_bytes=65536))
    run.learn_secrets()
    started = time.monotonic()
    out = run.command("x/out.txt", [endless])
    err = run.command("x/err.txt", [flood])
    assert time.monotonic() - started < 10
    assert out["status"] == "cut" and "printed more than 65536 bytes" in out["why"]
    assert out["bytes"] <= 65536
    # stderr is capped as well: a flood there cannot fill the host's temporary folder.
    assert err["status"] == "cut"
    assert err["bytes"] <= 65536 + STDERR_MAX


def test_a_missing_command_is_recorded_and_an_optional_one_is_absent(tmp_path):
    run = Collection(params(tmp_path))
    run.learn_secrets()
    missing = run.command("gpu/nvidia-smi-q.txt", ["no-such-nvidia-smi", "-q"])
    optional = run.command("x/fm.txt", ["no-such-fabricmanager"], optional=True)
    assert missing["status"] == "missing" and "not on this host" in missing["why"]
    assert optional["status"] == "absent"
    failing = run.command("x/false.txt", [sys.executable, "-c", "import sys; sys.exit('boom')"])
    assert failing["status"] == "failed" and failing["rc"] == 1 and "boom" in failing["why"]


# -- files ---------------------------------------------------------------------------------


def test_the_log_keeps_its_last_lines_and_a_big_record_its_start(tmp_path):
    p = params(tmp_path, log_lines=10, max_item_bytes=8192)
    Path(p["log_file"]).write_text("".join(f"line {n}\n" for n in range(5000)))
    server = Path(p["server_state_dir"])
    server.mkdir()
    (server / "launch.json").write_text(json.dumps({"argv": ["x" * 100] * 200}))
    result = collect(p)
    got = read_members(result["archive"])
    assert got["server/sglang.log"] == b"".join(f"line {n}\n".encode() for n in range(4990, 5000))
    by_name = items(result["archive"])
    assert by_name["server/sglang.log"]["status"] == "cut"
    assert by_name["records/launch.json"]["status"] == "cut"
    assert len(got["records/launch.json"]) <= 8192


def test_past_the_hosts_cap_an_item_is_left_out_and_recorded(tmp_path):
    p = params(tmp_path, max_item_bytes=50000, max_host_bytes=65536)
    server = Path(p["server_state_dir"])
    server.mkdir()
    for name in ("launch.json", "api-check.json"):
        (server / name).write_text(json.dumps({"pad": "y" * 40000}))
    result = collect(p)
    by_name = items(result["archive"])
    assert by_name["records/launch.json"]["status"] == "ok"
    assert by_name["records/api-check.json"]["status"] == "left_out"
    assert "records/api-check.json" not in read_members(result["archive"])
    assert result["bytes"] <= 65536


def test_links_fifos_and_folders_through_links_are_never_followed(tmp_path):
    p = params(tmp_path)
    logs = Path(p["canary_dir"]) / "logs"
    logs.mkdir(parents=True)
    outside = tmp_path / "outside.log"
    outside.write_text(f"outside the folder {API_KEY}\n")
    (logs / "ar.log").write_text("the ar canary\n")
    (logs / "evil.log").symlink_to(outside)
    (logs / "up.log").symlink_to("../../../outside.log")
    os.mkfifo(logs / "fifo.log")
    os.mkfifo(p["log_file"])  # a FIFO where the server's log should be: no hang
    Path(p["nccl_conf"]).symlink_to(outside)
    started = time.monotonic()
    result = collect(p)
    assert time.monotonic() - started < 20
    got, by_name = read_members(result["archive"]), items(result["archive"])
    assert got["canary/logs/ar.log"] == b"the ar canary\n"
    for name in ("canary/logs/evil.log", "canary/logs/up.log", "nccl/nccl.conf"):
        assert by_name[name]["status"] == "failed" and "a link" in by_name[name]["why"], name
        assert name not in got
    assert by_name["canary/logs/fifo.log"]["why"] == "not a regular file"
    assert by_name["server/sglang.log"]["why"] == "not a regular file"
    assert not any(b"outside the folder" in data for data in got.values())

    # A configured folder reached through a link (/opt/kimi on another disk) is read, the
    # links in it still are not; the collected folder itself a link is not read at all.
    relinked = params(tmp_path / "second", canary_dir=str(tmp_path / "linked"))
    Path(tmp_path / "linked").symlink_to(Path(p["canary_dir"]))
    again = items(collect(relinked)["archive"])
    assert again["canary/logs/ar.log"]["status"] == "ok"
    assert again["canary/logs/evil.log"]["status"] == "failed"
    link_dir = params(tmp_path / "third")
    Path(link_dir["canary_dir"]).mkdir(parents=True)
    Path(link_dir["canary_dir"], "logs").symlink_to(logs)
    third = items(collect(link_dir)["archive"])
    assert third["canary/logs"]["status"] == "failed" and "link" in third["canary/logs"]["why"]


# -- secrets -------------------------------------------------------------------------------


def test_every_secret_is_scrubbed_from_every_source_and_file_name(tmp_path):
    """The controller's key and token, and a key and token only the host knows (its secrets
    file, a left-over token file), planted in every source with their digests and base64
    forms; the archive holds every source, masked, and none of them."""
    p = params(tmp_path)
    root = Path(p["log_file"]).parent
    Path(p["secrets_file"]).write_text(f"api_key: '{HOST_KEY}'\n")
    Path(p["token_files"][0]).write_text(HOST_TOKEN + "\n")
    Path(p["env_file"]).write_text(
        f'HF_TOKEN="{HF_TOKEN}"\nKIMI_SERVER_API_KEY="{API_KEY}"\nNCCL_P2P_DISABLE="1"\n'
    )
    Path(p["log_file"]).write_text(f"server_args api_key='{API_KEY}'\n" + planted(ALL))
    for folder in ("server", "runtime", "canary/logs"):
        (root / folder).mkdir(parents=True)
    record = {"argv": ["--api-key", API_KEY], "environment": {"HF_TOKEN": HF_TOKEN}}
    for path in (
        root / "server" / "launch.json",
        root / "server" / "api-check.json",
        root / "runtime" / "runtime.json",
        root / "runtime" / "versions.json",
        root / "canary" / "canary.json",
        Path(p["preflight_record"]),
        Path(p["tuning_state"]),
        Path(p["acs_report"]),
    ):
        path.write_text(json.dumps({**record, "note": planted(ALL)}))
    Path(p["nccl_conf"]).write_text("NCCL_P2P_DISABLE=1\n" + "".join(f"# {s}\n" for s in ALL))
    (root / "canary" / "logs" / "dflash.log").write_text(planted(ALL))
    (root / "canary" / "logs" / f"{API_KEY}.log").write_text("named after the key\n")
    (root / HOST_TOKEN).mkdir()  # du names it
    fake_python = program(
        tmp_path,
        "python",
        "#!/bin/sh\n"
        f"printf 'pkg @ https://u:{HF_TOKEN}@host/p.whl\\n{planted(ALL)}' | sed 's/^/ /'\n",
    )
    p["pythons"] = {"release": fake_python}
    p["dmesg"] = program(
        tmp_path,
        "dmesg",
        "#!/bin/sh\n"
        + "".join(f"echo 'NVRM: Xid (PCI:0000:17:00): 79, {form}'\n" for form in forms(API_KEY)),
    )
    result = collect(p)
    got = read_members(result["archive"])
    du = "disk/du-" + safe_part(str(root).strip("/").replace("/", "-")) + ".txt"
    expected = {*SCRUBBED_SOURCES, SECRET_NAMED_LOG, du}
    assert expected <= set(got), expected - set(got)
    # Scrubbed, not dropped: each source is there with its secrets masked.
    for name in expected - {SECRET_NAMED_LOG}:
        assert b"********" in got[name], name
    assert b"NCCL_P2P_DISABLE" in got["nccl/nccl.conf"]
    assert got["server/sglang-secrets.yaml"] == b"api_key: ********\n"
    assert b'NCCL_P2P_DISABLE="1"' in got["server/kimi-sglang.env"]
    assert result["secrets_from"][1:] == [p["secrets_file"], p["env_file"], p["token_files"][0]]
    assert any("token file is on the host" in note for note in result["notes"])
    assert_no_secret(extract(result["archive"], tmp_path / "extracted"))
    flat = json.dumps(result)
    assert not any(form in flat for secret in ALL for form in forms(secret))


def test_secrets_and_environment_files_parse_as_their_readers_do():
    values, shown = secrets_file_values(
        "# root-only\napi_key: 'it''s-a-key'\nother: \"quoted\\\"value\"\nempty: ''\n"
    )
    assert "it's-a-key" in values and 'quoted"value' in values
    assert "" not in values and "''" not in values
    assert shown == "# root-only\napi_key: ********\nother: ********\nempty: ''\n"
    values, shown = env_file_values(
        'HF_TOKEN="a\\"b"\nEMPTY_TOKEN=""\nNCCL_DEBUG="INFO"\nexport MY_API_KEY=plain\n'
    )
    assert values == ['a"b', '"a\\"b"', "plain", "plain"]
    assert shown.splitlines() == [
        "HF_TOKEN=********",
        'EMPTY_TOKEN=""',
        'NCCL_DEBUG="INFO"',
        "MY_API_KEY=********",
    ]


def test_check_mode_collects_but_keeps_nothing(tmp_path):
    p = params(tmp_path)
    result = collect(p, check_mode=True)
    assert result["archive"] is None and result["work_dir"] is None
    assert list(Path(p["work_dir"]).iterdir()) == []
    assert result["counts"]


def test_bad_options_are_refused_with_found_needed_fix(tmp_path):
    with pytest.raises(BadInput, match=r"timeout is 0; needed 1 to 3600\. Fix: set diagnose_"):
        collect(params(tmp_path, timeout=0))
    with pytest.raises(BadInput, match=r"max_item_bytes .* is above max_host_bytes"):
        collect(params(tmp_path, max_item_bytes=1 << 20, max_host_bytes=1 << 17))
    with pytest.raises(BadInput, match="not an existing absolute folder"):
        collect(params(tmp_path, work_dir=str(tmp_path / "nowhere")))
    result = run_module("diagnose_collect", {"host": "h", "timeout": 0})
    assert result["failed"] and result["bad_input"]


def test_a_left_over_work_folder_is_removed_and_the_new_one_is_root_only(tmp_path):
    p = params(tmp_path)
    old = Path(p["work_dir"]) / "kimi-diagnose.leftover"
    old.mkdir(mode=0o700)
    os.utime(old, (time.time() - 3 * 3600,) * 2)
    young = Path(p["work_dir"]) / "kimi-diagnose.running"
    young.mkdir(mode=0o700)
    result = collect(p)
    assert not old.exists() and young.exists()
    assert stat.S_IMODE(os.stat(result["work_dir"]).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(result["archive"]).st_mode) == 0o600


# -- the controller --------------------------------------------------------------------------


def hostile_archive(path: Path) -> None:
    """A host archive a compromised host could send."""
    with tarfile.open(path, "w:gz") as tar:

        def add(name, data=b"x", kind=tarfile.REGTYPE, link=""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("manifest.json", json.dumps({"items": [{"name": "x", "status": "failed"}]}).encode())
        add("gpu/ok.txt", f"fine {API_KEY}\n".encode())
        add("/etc/cron.d/evil")
        add("../../escape")
        add("gpu/../../escape")
        add("link", kind=tarfile.SYMTYPE, link="/etc/shadow")
        add("hard", kind=tarfile.LNKTYPE, link="/etc/shadow")
        add("dev", kind=tarfile.CHRTYPE)
        add("folder", kind=tarfile.DIRTYPE)
        add(f"named-{API_KEY}")
        add("big.txt", b"z" * 200_000)
        add("after-big.txt", b"never read")


def test_a_hostile_host_archive_cannot_escape_or_grow_the_bundle(tmp_path):
    out = tmp_path / "out"
    prepared = prepare_output(str(out), "run-1")
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    staged = Path(prepared["staging_dir"]) / "host-0.tar.gz"
    hostile_archive(staged)
    done = build_bundle(
        str(out),
        "run-1",
        prepared["staging_dir"],
        ["evil/../host", "gone"],
        {
            "evil/../host": {"state": "collected", "archive": str(staged)},
            "gone": {"state": "unreachable", "why": "No route to host"},
        },
        [API_KEY],
        max_host_bytes=65536 - MANIFEST_MAX + 100_000,
    )
    bundle = Path(done["bundle"])
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600
    assert not Path(prepared["staging_dir"]).exists()
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        assert all(m.isreg() for m in tar.getmembers())
        index = json.loads(tar.extractfile("run-1/index.json").read())
        ok = tar.extractfile("run-1/evil_.._host/gpu/ok.txt").read()
    assert sorted(names) == [
        "run-1/evil_.._host/gpu/ok.txt",
        "run-1/evil_.._host/manifest.json",
        "run-1/index.json",
    ]
    assert ok == b"fine ********\n"
    host = index["hosts"]["evil/../host"]
    left = {entry["name"]: entry["why"] for entry in host["left_out"]}
    assert "not a regular file" in left["link"] and "not a regular file" in left["dev"]
    assert "not a member name" in left["/etc/cron.d/evil"]
    assert "not a member name" in left["../../escape"]
    assert "not a member name" in left["named-********"]
    assert "past the host's cap" in left["big.txt"]
    assert "after-big.txt" not in left  # reading stopped at the cap
    assert host["problems"] == [{"name": "x", "status": "failed", "source": "", "why": ""}]
    assert index["unreachable"] == ["gone"] and index["hosts"]["gone"]["why"] == "No route to host"
    extract(str(bundle), tmp_path / "x")
    assert_no_secret(tmp_path / "x")


def test_a_host_without_an_outcome_is_failed_and_an_archive_outside_staging_refused(tmp_path):
    out = tmp_path / "out"
    prepared = prepare_output(str(out), "r")
    elsewhere = tmp_path / "elsewhere.tar.gz"
    hostile_archive(elsewhere)
    done = build_bundle(
        str(out),
        "r",
        prepared["staging_dir"],
        ["a", "b"],
        {"a": {"state": "collected", "archive": str(elsewhere)}},
        [],
        1 << 20,
    )
    assert done["failed_hosts"] == ["a", "b"]
    assert "staging folder" in done["hosts"]["a"]["why"]
    assert "no outcome recorded" in done["hosts"]["b"]["why"]


def test_the_output_folder_is_checked_before_any_host_is_asked(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(BadInput, match=r"exists and is not a folder.*Fix:"):
        prepare_output(str(afile), "r")
    with pytest.raises(BadInput, match=r"cannot write there .*Not a directory.*Fix:"):
        prepare_output(str(afile / "sub"), "r")
    with pytest.raises(BadInput, match="not absolute"):
        prepare_output("relative/dir", "r")
    with pytest.raises(BadInput, match="run id"):
        prepare_output(str(tmp_path / "o"), "../escape")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "taken.tar.gz").write_text("")
    with pytest.raises(BadInput, match="is never replaced"):
        prepare_output(str(tmp_path / "o"), "taken")
    assert prepare_output(str(tmp_path / "new"), "r", check_mode=True)["staging_dir"] is None
    assert not (tmp_path / "new").exists()
    failed = run_module(
        "diagnose_bundle", {"step": "prepare", "output_dir": str(afile), "run_id": "r"}
    )
    assert failed["failed"] and "is not a folder" in failed["msg"]


def test_the_controller_scrub_catches_what_a_host_let_through(tmp_path):
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = f"Authorization: Bearer {API_KEY}\n".encode()
        info = tarfile.TarInfo("server/sglang.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    scrub = Scrubber([API_KEY])
    got, left_out, found = read_host_archive(str(archive), 1 << 20, scrub)
    assert got == [("server/sglang.log", b"Authorization: Bearer ********\n")]
    assert left_out == [] and found == {} and scrub.count >= 1


# -- the playbook's wiring -------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_diagnose_yml_escalates_stops_on_example_hosts_and_takes_no_lock():
    """It acts on the GPU hosts as every play there does (kimi_become), stops on a shipped
    example host before any connection, and takes no per-host lock: it only reads, and must
    run while a deploy holds one or after one failed."""
    import yaml

    (play,) = yaml.safe_load((REPO / "diagnose.yml").read_text())
    assert play["hosts"] == "gpu_hosts" and play["become"] == "{{ kimi_become | bool }}"
    assert play["gather_facts"] is False  # a broken host may not answer the setup module
    assert [t["ansible.builtin.import_tasks"] for t in play["pre_tasks"]] == [
        "playbooks/tasks/example_hosts.yml",
        "playbooks/tasks/settings_check.yml",
    ]
    assert play["roles"] == [{"role": "diagnose"}]
    assert "import_playbook" not in json.dumps(play)
    assert (
        "diagnose.yml"
        in (REPO / "Makefile").read_text().split("ROOT_PLAYBOOKS :=")[1].split("\n")[0]
    )
    lock_tasks = yaml.safe_load((REPO / "playbooks/tasks/lock.yml").read_text())
    assert lock_tasks[0]["ansible.builtin.import_tasks"] == "example_hosts.yml"
