"""Weights helpers without hosts: pins, manifest trust, status of a vanished download."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible.module_utils.weights import worker as weights_worker
from ansible.module_utils.weights.manifest import (
    bytes_on_disk,
    inspect_files,
    partial_files,
    progress_line,
    write_manifest,
)

from tests.support.modules import assert_unchanged, run_module

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.weights


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        # Hash lines (indented) and environment markers are not pins.
        if line and not line[0].isspace() and not line.startswith("#"):
            name, version = line.split(";")[0].rstrip(" \\").split("==")
            found[name.lower().replace("_", "-")] = version
    return found


def test_host_tools_are_pinned_as_in_the_one_lock():
    host = pins(REPO / "roles/weights/files/requirements-host.txt")
    lock = pins(REPO / "requirements.lock")
    assert host["huggingface-hub"] == "2.4.0"
    assert {name: lock.get(name) for name in host} == host


def repo(tmp_path: Path) -> tuple[Path, list[dict]]:
    data = {"a.safetensors": b"a" * 4096, "config.json": b"{}"}
    for name, content in data.items():
        (tmp_path / name).write_bytes(content)
    files = [
        {
            "path": "a.safetensors",
            "size": 4096,
            "sha256": hashlib.sha256(data["a.safetensors"]).hexdigest(),
        },
        {
            "path": "config.json",
            "size": 2,
            "blob_id": hashlib.sha1(b"blob 2\0{}", usedforsecurity=False).hexdigest(),
        },
    ]
    return tmp_path, files


def test_manifest_vouches_for_unchanged_files_only(tmp_path):
    folder, files = repo(tmp_path)
    first = inspect_files(str(folder), files, "r" * 40, "full", 2)
    assert first["hashed"] == 2 and not first["stale"] and not first["missing"]
    write_manifest(str(folder), "o/n", "r" * 40, "full", first["good"])
    second = inspect_files(str(folder), files, "r" * 40, "full", 2)
    assert second["hashed"] == 0 and set(second["good"]) == {"a.safetensors", "config.json"}
    # Another revision: the manifest says nothing about it.
    assert inspect_files(str(folder), files, "s" * 40, "full", 2)["hashed"] == 2
    # Same size, new content, new mtime: hashed again and caught.
    (folder / "a.safetensors").write_bytes(b"b" * 4096)
    third = inspect_files(str(folder), files, "r" * 40, "full", 2)
    assert third["stale"] == [{"path": "a.safetensors", "reason": "checksum mismatch"}]
    forced = inspect_files(str(folder), files, "r" * 40, "full", 2, force_hash=True)
    assert forced["hashed"] == 2


def test_weights_check_module_reports_missing_and_wrong(tmp_path):
    folder, files = repo(tmp_path)
    (folder / "config.json").write_bytes(b"{ }")
    files.append({"path": "gone.bin", "size": 10, "sha256": "0" * 64})
    result = run_module(
        "weights_check",
        {"local_dir": str(folder), "repo_id": "o/n", "revision": "r" * 40, "files": files},
    )
    assert result["complete"] is False
    assert result["missing"] == ["gone.bin"]
    assert result["stale"][0]["path"] == "config.json"
    assert result["bytes_missing"] == 12


def test_status_notices_a_download_that_died(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    status = tmp_path / "status.json"
    status.write_text(
        json.dumps(
            {
                "repo_id": "o/n",
                "state": "downloading",
                "pid": dead.pid,
                "bytes_done": 5,
                "bytes_total": 10,
            }
        )
    )
    result = run_module("weights_status", {"status_file": str(status)})
    assert result["done"] and not result["succeeded"] and result["state"] == "gone"
    assert "ended without finishing" in result["progress"]
    status.write_text(
        json.dumps(
            {
                "repo_id": "o/n",
                "state": "downloading",
                "pid": os.getpid(),
                "bytes_done": 5 << 30,
                "bytes_total": 10 << 30,
                "rate_bytes_per_s": 1 << 30,
                "eta_s": 5,
                "files_done": 3,
                "files_total": 6,
            }
        )
    )
    running = run_module("weights_status", {"status_file": str(status)})
    assert not running["done"]
    assert running["progress"] == (
        "o/n: downloading 5.0 GiB of 10.0 GiB (50.0%), 1.0 GiB/s, ETA 0m05s, files 3/6, restarts 0"
    )
    missing = run_module("weights_status", {"status_file": str(tmp_path / "none.json")})
    assert missing["state"] == "starting" and not missing["done"]


def test_a_poll_waits_for_the_end_of_the_download_and_no_longer(tmp_path):
    """wait_s: the poll answers when the status turns final, not at the next interval, and a
    download still running is answered about when the wait is over."""
    status = tmp_path / "status.json"
    running = {"repo_id": "o/n", "state": "downloading", "pid": os.getpid(), "bytes_total": 10}
    status.write_text(json.dumps(running))
    started = time.monotonic()
    waited = run_module("weights_status", {"status_file": str(status), "wait_s": 1.2})
    assert not waited["done"] and waited["state"] == "downloading"
    assert 1.0 <= time.monotonic() - started < 8
    ends = threading.Timer(1.0, lambda: status.write_text(json.dumps({**running, "state": "done"})))
    ends.start()
    started = time.monotonic()
    ended = run_module("weights_status", {"status_file": str(status), "wait_s": 30})
    ends.join()
    assert ended["done"] and ended["succeeded"] and time.monotonic() - started < 10
    refused = run_module("weights_status", {"status_file": str(status), "wait_s": -1})
    assert refused.get("failed") and "wait_s must be between 0 and 3600" in refused["msg"]


def test_progress_line_without_rate():
    line = progress_line({"repo_id": "o/n", "state": "checking", "bytes_total": 0})
    assert "ETA unknown" in line


def test_every_module_documents_itself():
    """DOCUMENTATION, EXAMPLES and RETURN parse for every module (ansible-doc reads them): one
    ansible-doc for all of them, which fails as a whole where any one does not parse."""
    names = sorted(module.stem for module in (REPO / "library").glob("*.py"))
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-doc"),
            "--json",
            "-M",
            str(REPO / "library"),
            "-t",
            "module",
            *names,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert sorted(docs) == names
    for name, doc in docs.items():
        assert isinstance(doc["doc"], dict) and doc["doc"].get("short_description"), name
        assert doc["examples"] and doc["return"], name


TOKEN = "hf_units_token_4b1e"


@pytest.fixture
def gated_hub(monkeypatch, tmp_path):
    """A gated repo behind the redirecting hub, a token file for it, and a module runner."""
    from tests.support.hub_server import LocalHub

    # Two files over huggingface_hub's 10 MiB read chunk, so it can resume inside them.
    data = {
        "a.safetensors": os.urandom(24 << 20),
        "b.safetensors": os.urandom(12 << 20),
        "config.json": b'{"x": 1}',
    }
    token_file = tmp_path / "hf-token"
    token_file.touch(mode=0o600)
    token_file.write_text(TOKEN)
    with LocalHub() as hub:
        hub.valid_tokens.add(TOKEN)
        hub.add_repo("o/n", data, gated=True, approved_tokens={TOKEN})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        listing = [
            {
                "path": name,
                "size": len(content),
                "sha256": hashlib.sha256(content).hexdigest() if len(content) > 1024 else None,
                "blob_id": hub.repos["o/n"].files[name].git_oid,
            }
            for name, content in data.items()
        ]

        def download(**extra) -> dict:
            return run_module(
                "weights_download",
                {
                    "repo_id": "o/n",
                    "revision": hub.repos["o/n"].sha,
                    "local_dir": str(tmp_path / "w"),
                    "files": listing,
                    "python": sys.executable,
                    "hf_token_file": str(token_file),
                    "status_file": str(tmp_path / "s" / "status.json"),
                    "log_file": str(tmp_path / "s" / "download.log"),
                    "poll_interval": 0.2,
                    **extra,
                },
            )

        yield hub, data, download


def landed(tmp_path: Path, data: dict[str, bytes]) -> None:
    """Every file in place with its content, vouched for by the manifest, no partial left."""
    for name, content in data.items():
        assert (tmp_path / "w" / name).read_bytes() == content
    manifest = json.loads((tmp_path / "w" / "kimi-manifest.json").read_text())
    assert all(entry["hash_checked"] for entry in manifest["files"].values())
    assert not list((tmp_path / "w").rglob("*.incomplete"))


def no_token_at_storage(hub) -> None:
    """LFS bodies came from the storage origin, which never saw the token; the hub did."""
    storage = hub.at_storage()
    assert storage and all(r.status in (200, 206, 499) for r in storage)
    assert not any(r.authenticated or r.token_seen for r in storage)
    assert {r.file for r in hub.fetched() if r.origin == "storage"} == {
        "a.safetensors",
        "b.safetensors",
    }
    redirects = [r for r in hub.requests if r.status == 302]
    assert redirects and all(r.authenticated for r in redirects)


@pytest.mark.parametrize("xet_disabled", ["1", ""], ids=["plain-http", "huggingface_hub"])
def test_download_module_both_transfers(tmp_path, monkeypatch, gated_hub, xet_disabled):
    """Plain HTTP (xet off) and snapshot_download (xet setting left alone) both follow the
    hub's redirect, keep the token from the storage origin, and land verified files."""
    hub, data, download = gated_hub
    monkeypatch.setenv("HF_HUB_DISABLE_XET", xet_disabled)
    result = download()
    assert not result.get("failed"), result
    assert result["bytes_total"] == sum(len(c) for c in data.values())
    assert result["transfers"] == ["http" if xet_disabled else "hub"]
    assert result["restarts"] == 0
    assert 0 < result["download_seconds"] < 60
    landed(tmp_path, data)
    no_token_at_storage(hub)


def test_plain_http_resumes_at_the_storage_origin(tmp_path, monkeypatch, gated_hub):
    """The kit's transfer, cut short by the storage origin, is restarted by the watchdog and
    resumes there with a Range request from where the partial file ends."""
    from tests.support.hub_server import Stall

    hub, data, download = gated_hub
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    hub.stalls.append(Stall(path="a.safetensors", after_bytes=5 << 20, seconds=0))
    result = download()
    assert not result.get("failed"), result
    assert result["restarts"] == 1 and result["transfers"] == ["http", "http"]
    landed(tmp_path, data)
    no_token_at_storage(hub)
    first, resumed = hub.fetched("a.safetensors")
    assert first.origin == resumed.origin == "storage"
    assert (first.range, resumed.range, resumed.status) == (None, f"bytes={5 << 20}-", 206)
    # The resumed request went through the hub again, which signed a fresh URL.
    assert [r.range for r in hub.requests if r.status == 302 and r.file == "a.safetensors"] == [
        None,
        f"bytes={5 << 20}-",
    ]


def test_default_path_resumes_inside_huggingface_hub(tmp_path, gated_hub):
    """With the xet setting left alone, a cut on the storage origin is resumed by
    huggingface_hub itself (from its last 10 MiB chunk), without a watchdog restart."""
    from tests.support.hub_server import Stall

    hub, data, download = gated_hub
    hub.stalls.append(Stall(path="a.safetensors", after_bytes=15 << 20, seconds=0))
    result = download()
    assert not result.get("failed"), result
    assert result["restarts"] == 0 and result["transfers"] == ["hub"]
    landed(tmp_path, data)
    no_token_at_storage(hub)
    ranges = [r.range for r in hub.fetched("a.safetensors")]
    assert ranges == [None, f"bytes={10 << 20}-"]


def test_default_path_stall_switches_to_plain_http(tmp_path, gated_hub):
    """huggingface_hub's download stuck at the storage origin (silent for longer than the
    stall timeout): the watchdog kills it and the kit's own transfer finishes the repo."""
    from tests.support.hub_server import Stall

    hub, data, download = gated_hub
    hub.stalls.append(Stall(path="a.safetensors", after_bytes=3 << 20, seconds=60))
    result = download(stall_timeout=2)
    assert not result.get("failed"), result
    assert result["restarts"] == 1 and result["transfers"] == ["hub", "http"]
    log = (tmp_path / "s" / "download.log").read_text()
    assert (
        log.index("transfer: hub") < log.index("no new bytes for 2s") < log.index("transfer: http")
    )
    assert "restart 1/5 with xet off (plain HTTP)" in log
    landed(tmp_path, data)
    no_token_at_storage(hub)
    stuck = [r for r in hub.fetched("a.safetensors") if r.status != 499]
    agents = [r.headers.get("user-agent") or r.headers.get("User-Agent") for r in stuck]
    assert "hf_hub/" in agents[0] and agents[-1].startswith("Python-urllib/")
    # huggingface_hub's partial file has a name of its own: the kit starts the file again.
    assert stuck[-1].range is None and stuck[-1].status == 200


def test_weights_check_records_files_it_verified(tmp_path):
    """Weights put in place by hand are hashed once, then vouched for by the manifest."""
    folder, files = repo(tmp_path)
    args = {"local_dir": str(folder), "repo_id": "o/n", "revision": "r" * 40, "files": files}
    first = run_module("weights_check", args)
    assert first["complete"] and first["hashed"] == 2
    assert first["changed"] and first["manifest_refreshed"]
    second = run_module("weights_check", args)
    assert_unchanged(second)
    assert second["complete"] and second["hashed"] == 0
    untouched = run_module("weights_check", {**args, "revision": "s" * 40}, check_mode=True)
    assert_unchanged(untouched)
    assert untouched["hashed"] == 2


# --------------------------------------------------------------------------------------------
# The download worker (module_utils/weights/worker.py): its pure parts, and the program itself
# run as the module runs it, in a Python with the standard library alone (-I -S: no Ansible,
# no huggingface_hub), over its plain HTTP transfer against the local hub.


@pytest.mark.parametrize(
    "x_error_code, status, expected",
    [
        ("GatedRepo", 401, (weights_worker.EXIT_AUTH, "gated")),
        ("GatedRepo", 403, (weights_worker.EXIT_AUTH, "gated")),
        (None, 401, (weights_worker.EXIT_AUTH, "invalid_token")),
        ("RevisionNotFound", 404, (weights_worker.EXIT_REVISION, "revision_not_found")),
        ("RepoNotFound", 404, (weights_worker.EXIT_NOT_FOUND, "not_found")),
        ("EntryNotFound", 404, None),
        (None, 500, None),
    ],
)
def test_worker_maps_hub_answers_to_its_exit_codes(x_error_code, status, expected):
    assert weights_worker.http_failure(x_error_code, status) == expected


def test_worker_error_line_is_what_the_module_reads_back():
    line = weights_worker.error_line(weights_worker.KIND_DISK_FULL, "x" * 5000)
    assert line.startswith(weights_worker.ERROR_PREFIX)
    assert len(json.loads(line)["detail"]) == weights_worker.DETAIL_CHARS
    older = weights_worker.error_line(weights_worker.KIND_GATED, "first")
    log = [older, "Traceback (most recent call last):", line, "exit"]
    assert weights_worker.last_error(log)["error"] == "disk_full"
    assert weights_worker.last_error(["no error here"]) == {}
    # A cut-off last error line is not mistaken for an older one.
    assert weights_worker.last_error([older, line[:20]]) == {}


def test_worker_partial_files_are_the_ones_the_module_counts(tmp_path):
    revision = "0123456789abcdef" * 2 + "01234567"
    suffix = weights_worker.partial_suffix(revision)
    part = tmp_path / weights_worker.PARTIAL_DIR / f"a.bin{suffix}"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 10)
    assert part.name == "a.bin.0123456789ab.kimi.incomplete"
    assert partial_files(str(tmp_path), revision, "http") == [str(part)]
    listing = [{"path": "a.bin", "size": 20}]
    assert bytes_on_disk(str(tmp_path), listing, revision, "http") == (10, 0)
    # Another revision's partial file is not this download's progress.
    assert partial_files(str(tmp_path), "f" * 40, "http") == []
    assert weights_worker.resume_offset(10, 20) == 10
    assert weights_worker.resume_offset(30, 20) == 0
    assert weights_worker.resume_offset(30, None) == 30
    assert weights_worker.resolve_url("http://h:1/", "o/n", "r", "d/f.json") == (
        "http://h:1/o/n/resolve/r/d/f.json"
    )


def run_worker(spec: dict, endpoint: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            inspect.getsource(weights_worker),
            json.dumps(spec),
            weights_worker.PROCESS_MARK,
        ],
        env={"PATH": "/usr/bin:/bin", "HF_ENDPOINT": endpoint},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_worker_program_downloads_and_reports_hub_errors(tmp_path):
    from tests.support.hub_server import LocalHub

    data = {"a.safetensors": os.urandom(3 << 20), "config.json": b'{"x": 1}'}
    with LocalHub() as hub:
        hub.add_repo("o/open", data)
        hub.add_repo("o/gated", data, gated=True)
        spec = {
            "repo_id": "o/open",
            "revision": hub.repos["o/open"].sha,
            "local_dir": str(tmp_path / "w"),
            "max_workers": 2,
            "transfer": "http",
            "files": [{"path": name, "size": len(content)} for name, content in data.items()],
            "missing": list(data),
        }
        done = run_worker(spec, hub.url)
        assert done.returncode == 0, done.stderr
        for name, content in data.items():
            assert (tmp_path / "w" / name).read_bytes() == content
        assert not partial_files(str(tmp_path / "w"), spec["revision"], "http")

        cases = [
            ({"repo_id": "o/gated"}, weights_worker.EXIT_AUTH, "gated"),
            ({"revision": "f" * 40}, weights_worker.EXIT_REVISION, "revision_not_found"),
            ({"repo_id": "o/none"}, weights_worker.EXIT_NOT_FOUND, "not_found"),
        ]
        for change, code, kind in cases:
            failed = run_worker({**spec, **change, "local_dir": str(tmp_path / kind)}, hub.url)
            assert failed.returncode == code, failed.stderr
            assert weights_worker.last_error(failed.stderr.splitlines())["error"] == kind


# The download's logic (module_utils/weights/transfer.py) without a hub.


def transfer_params(tmp_path: Path, **extra) -> dict:
    return {
        "repo_id": "o/n",
        "revision": "0" * 40,
        "local_dir": str(tmp_path / "w"),
        "files": [{"path": "a.bin", "size": 4}, {"path": "b.bin", "size": None}],
        "python": sys.executable,
        "hf_token_file": None,
        "status_file": str(tmp_path / "s" / "status.json"),
        "log_file": str(tmp_path / "s" / "download.log"),
        "verify": "full",
        "rehash": False,
        "stall_timeout": 300,
        "max_restarts": 5,
        "xet_fallback": True,
        "max_workers": 8,
        "hash_workers": 0,
        "poll_interval": 1.0,
        **extra,
    }


def test_download_arguments_are_refused_before_anything_is_touched(tmp_path):
    from ansible.module_utils.weights.transfer import Download, Failure, argument_problem

    assert argument_problem(transfer_params(tmp_path)) is None
    branch = argument_problem(transfer_params(tmp_path, revision="main"))
    assert "40-character commit SHA, got 'main'" in branch
    upper = transfer_params(tmp_path, revision="A" * 40)
    assert "40-character" in argument_problem(upper)
    no_python = argument_problem(transfer_params(tmp_path, python=str(tmp_path / "nopython")))
    assert no_python.endswith("installs huggingface_hub into its tools venv first.")
    download = Download(transfer_params(tmp_path, revision="main"))
    with pytest.raises(Failure) as failure:
        download.run()
    download.fail(failure.value)
    assert not (tmp_path / "w").exists()
    status = json.loads((tmp_path / "s" / "status.json").read_text())
    assert status["state"] == "failed" and status["message"] == branch
    assert f"watchdog: failed: {branch}" in (tmp_path / "s" / "download.log").read_text()


def test_download_names_incomplete_files_and_picks_the_transfer(tmp_path, monkeypatch):
    from ansible.module_utils.weights.transfer import Download

    download = Download(transfer_params(tmp_path))
    (tmp_path / "w").mkdir()
    assert download.incomplete_files() == ["a.bin"]  # a file of unknown size is never short
    (tmp_path / "w" / "a.bin").write_bytes(b"abc")
    assert download.incomplete_files() == ["a.bin"]
    (tmp_path / "w" / "a.bin").write_bytes(b"abcd")
    assert download.incomplete_files() == []
    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    assert download.transfer() == "hub"
    download.restarts = 1
    assert download.transfer() == "http"
    assert Download(transfer_params(tmp_path, xet_fallback=False)).transfer() == "hub"
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    assert Download(transfer_params(tmp_path)).transfer() == "http"


def test_only_a_worker_this_module_started_is_killed(tmp_path):
    from ansible.module_utils.weights.transfer import kill_previous_worker

    def start(*argv: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", *argv], start_new_session=True
        )

    def named(process: subprocess.Popen, mark: str) -> None:
        # Popen returns once exec began; the kernel fills /proc/<pid>/cmdline a moment later.
        deadline = time.monotonic() + 10
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        while mark.encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)

    pid_file = tmp_path / "worker.pid"
    other, ours = start("someone-else"), start(weights_worker.PROCESS_MARK)
    named(other, "someone-else")
    named(ours, weights_worker.PROCESS_MARK)
    try:
        pid_file.write_text(f"{other.pid}\n")
        kill_previous_worker(str(pid_file))
        assert other.poll() is None
        pid_file.write_text(f"{ours.pid}\n")
        kill_previous_worker(str(pid_file))
        assert ours.wait(timeout=10) != 0
        pid_file.write_text("not a pid\n")
        kill_previous_worker(str(pid_file))  # nothing to recognise: nothing happens
    finally:
        for process in (other, ours):
            process.kill()
            process.wait(timeout=10)


# --------------------------------------------------------------------------------------------
# A malicious hub listing (issue 16, defect 2): no entry is written, read or deleted outside
# the repository's folder, and the refusal names the entry and where the listing came from.


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("config.json", None),
        ("sub/dir/model.safetensors", None),
        (".gitattributes", None),
        ("../../x", "a '..' component"),
        ("a/../../x", "a '..' component"),
        ("/etc/passwd", "an absolute path"),
        ("a\\..\\x", "a backslash"),
        ("a\0b", "a NUL byte"),
        ("", "empty"),
        ("a//b", "an empty component"),
        ("a/./b", "a '.' component"),
        ("a/", "an empty component"),
        ("kimi-manifest.json", "the kit's own"),
        (".cache/huggingface/download/x.metadata", "the kit's own"),
        ("x" * 300, "longer than"),
        ("link/escape.txt", "resolves outside"),
        ("inside/ok.txt", None),
    ],
)
def test_unsafe_listing_paths_are_named(tmp_path, path, reason):
    local = tmp_path / "w"
    (local / "real").mkdir(parents=True)
    (local / "link").symlink_to(tmp_path)  # a symlink inside the folder pointing outside
    (local / "inside").symlink_to(local / "real")  # one that stays inside is fine
    found = weights_worker.unsafe_path(str(local), path)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found
    # Without a folder (the controller's listing check), only the name is judged.
    if reason != "resolves outside":
        assert (weights_worker.unsafe_path(None, path) is None) == (reason is None)


def test_listing_entries_are_type_checked(tmp_path):
    from ansible.module_utils.weights.manifest import UnsafeListing, check_listing

    where = {"endpoint": "http://hub.test", "repo_id": "o/n", "revision": "r" * 40}
    good = [{"path": "a", "size": 1, "sha256": "0" * 64, "blob_id": None}]
    check_listing(str(tmp_path), good, **where)
    for bad in (
        [{"path": 5, "size": 1}],
        [{"path": "a", "size": -1}],
        [{"path": "a", "size": "12"}],
        [{"path": "a", "size": 1, "sha256": "zz"}],
        [{"path": "a", "size": 1, "blob_id": 7}],
        ["a"],
        [{"path": "a", "size": 1}, {"path": "a", "size": 1}],
    ):
        with pytest.raises(UnsafeListing) as refused:
            check_listing(str(tmp_path), bad, **where)
        assert "http://hub.test" in str(refused.value) and "o/n@" in str(refused.value)


EVIL_DATA = {"config.json": b'{"x": 1}', "../../escape.txt": b"written outside"}


def evil_listing(hub, repo_id: str) -> list[dict]:
    return [
        {
            "path": f.path,
            "size": f.size,
            "sha256": f.sha256 if f.is_lfs else None,
            "blob_id": f.git_oid,
        }
        for f in hub.repos[repo_id].files.values()
    ]


def test_worker_refuses_a_listing_that_escapes_its_folder(tmp_path):
    from tests.support.hub_server import LocalHub

    with LocalHub() as hub:
        hub.add_repo("o/evil", EVIL_DATA)
        spec = {
            "repo_id": "o/evil",
            "revision": hub.repos["o/evil"].sha,
            "local_dir": str(tmp_path / "a" / "w"),
            "max_workers": 2,
            "transfer": "http",
            "files": [{"path": name, "size": len(data)} for name, data in EVIL_DATA.items()],
            "missing": list(EVIL_DATA),
        }
        done = run_worker(spec, hub.url)
    assert not (tmp_path / "escape.txt").exists()
    assert done.returncode == weights_worker.EXIT_UNSAFE, done.stderr
    error = weights_worker.last_error(done.stderr.splitlines())
    assert error["error"] == weights_worker.KIND_UNSAFE_PATH
    assert "'../../escape.txt'" in error["detail"] and hub.url in error["detail"]
    assert [r for r in hub.requests if r.file] == []  # nothing was fetched


@pytest.mark.parametrize("transfer", ["1", ""], ids=["plain-http", "huggingface_hub"])
@pytest.mark.parametrize(
    "entry", ["../../escape.txt", "link/escape.txt"], ids=["dotdot", "symlink"]
)
def test_download_module_refuses_a_malicious_listing(tmp_path, monkeypatch, transfer, entry):
    from tests.support.hub_server import LocalHub

    data = {"config.json": b'{"x": 1}', entry: b"written outside"}
    local = tmp_path / "a" / "w"
    local.mkdir(parents=True)
    (local / "link").symlink_to(tmp_path)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", transfer)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with LocalHub() as hub:
        hub.add_repo("o/evil", data)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        sha = hub.repos["o/evil"].sha
        result = run_module(
            "weights_download",
            {
                "repo_id": "o/evil",
                "revision": sha,
                "local_dir": str(local),
                "files": evil_listing(hub, "o/evil"),
                "python": sys.executable,
                "status_file": str(tmp_path / "s" / "status.json"),
                "log_file": str(tmp_path / "s" / "download.log"),
                "poll_interval": 0.2,
                "max_restarts": 0,
            },
        )
    assert not (tmp_path / "escape.txt").exists()
    assert result.get("failed"), result
    assert f"{entry!r}" in result["msg"] and hub.url in result["msg"]
    assert f"o/evil@{sha}" in result["msg"]
    assert not (local / "kimi-manifest.json").exists()


def test_weights_check_refuses_a_listing_that_points_outside(tmp_path):
    """A file outside the folder that matches the listing is not vouched for."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"abcd")
    (tmp_path / "w").mkdir()
    files = [{"path": "../outside.bin", "size": 4, "sha256": hashlib.sha256(b"abcd").hexdigest()}]
    result = run_module(
        "weights_check",
        {"local_dir": str(tmp_path / "w"), "repo_id": "o/n", "revision": "r" * 40, "files": files},
    )
    assert result.get("failed"), result
    assert "'../outside.bin'" in result["msg"] and "o/n@" + "r" * 40 in result["msg"]
    assert not (tmp_path / "w" / "kimi-manifest.json").exists()


def test_hub_repo_info_refuses_a_malicious_listing(monkeypatch):
    from tests.support.hub_server import LocalHub

    with LocalHub() as hub:
        hub.add_repo("o/evil", EVIL_DATA)
        hub.add_repo("o/fine", {"config.json": b"{}"})
        result = run_module(
            "hub_repo_info",
            {
                "repos": {"target": {"repo_id": "o/fine"}, "dflash": {"repo_id": "o/evil"}},
                "endpoint": hub.url,
            },
        )
    assert not result.get("failed"), result
    assert result["repos"]["target"]["access"] == "ok"
    evil = result["repos"]["dflash"]
    assert evil["access"] == "unsafe_listing" and evil["files"] == []
    assert "'../../escape.txt'" in evil["message"] and hub.url in evil["message"]
    assert "o/evil@main" in evil["message"]


def test_hub_repo_info_in_ansible_playbooks_worker_answers_as_the_module(monkeypatch):
    """Its action plugin runs the module's own spec and act() in the worker: the same answer
    (access verdicts, commits, files, the unsafe listing's message) and the same refusals."""
    from ansible.module_utils.host.in_process import run_in_process
    from ansible.module_utils.weights import hub_repo_info_task as task

    from tests.support.hub_server import LocalHub

    with LocalHub() as hub:
        hub.valid_tokens.add("hf_inproc_good_1")
        hub.add_repo("o/evil", EVIL_DATA)
        hub.add_repo("o/fine", {"config.json": b"{}", "model.safetensors": b"x" * 100})
        hub.add_repo("o/gated", {"config.json": b"{}"}, gated=True, approved_tokens=set())
        args = {
            "repos": {
                "target": {"repo_id": "o/fine"},
                "dflash": {"repo_id": "o/evil"},
                "eagle3": {"repo_id": "o/gated", "revision": "main"},
            },
            "endpoint": hub.url,
            "token": "hf_inproc_good_1",
        }
        module = run_module("hub_repo_info", args)
        process = run_in_process("hub_repo_info", task.SPEC, args, task.act, False)
        bad = {**args, "timeout": 30, "deadline": 10}
        refused = (
            run_module("hub_repo_info", bad),
            run_in_process("hub_repo_info", task.SPEC, bad, task.act, False),
        )
    assert {k: v for k, v in module.items() if k != "invocation"} == process
    assert process["repos"]["target"]["access"] == "ok"
    assert process["repos"]["dflash"]["access"] == "unsafe_listing"
    assert process["repos"]["eagle3"]["access"] == "no_access"
    assert "hf_inproc_good_1" not in repr(process)
    assert refused[0]["msg"] == refused[1]["msg"] and "at most deadline" in refused[1]["msg"]


# --------------------------------------------------------------------------------------------
# Hub queries have deadlines and retry a busy hub (issue 16, defect 3).


def hub_info(hub, deadline: float, timeout: float = 1, **repos) -> tuple[dict, float]:
    started = time.monotonic()
    result = run_module(
        "hub_repo_info",
        {
            "repos": repos or {"target": {"repo_id": "o/n"}},
            "endpoint": hub.url,
            "timeout": timeout,
            "deadline": deadline,
        },
    )
    return result, time.monotonic() - started


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefix", ["/api/models/o/n/revision", "/api/models/o/n/auth-check"])
def test_hub_repo_info_gives_up_on_a_silent_hub_by_its_deadline(prefix):
    from tests.support.hub_server import LocalHub

    with LocalHub() as hub:
        hub.add_repo("o/n", {"config.json": b"{}"})
        hub.hangs.append(prefix)
        result, elapsed = hub_info(hub, deadline=3)
    assert elapsed < 6, elapsed
    assert not result.get("failed"), result
    repo = result["repos"]["target"]
    assert repo["access"] == "unreachable"
    assert hub.url in repo["message"] and "could not be reached" in repo["message"]
    assert "no answer within" in repo["message"]


@pytest.mark.timeout(60)
def test_hub_repo_info_retries_a_busy_hub_within_its_deadline():
    from tests.support.hub_server import Busy, LocalHub

    with LocalHub() as hub:
        hub.add_repo("o/n", {"config.json": b"{}"})
        hub.busy += [
            Busy("/api/models/o/n/revision", 429, times=1, retry_after="1"),
            Busy("/api/models/o/n/revision", 503, times=2),
            Busy("/api/models/o/n/auth-check", 502, times=1),
        ]
        result, elapsed = hub_info(hub, deadline=20)
        asked = [r.status for r in hub.requests if r.path.startswith("/api/models/o/n/revision")]
    assert result["repos"]["target"]["access"] == "ok", result
    assert asked == [429, 503, 503, 200]
    assert 1 <= elapsed < 15  # the Retry-After second was honoured
    with LocalHub() as hub:
        hub.add_repo("o/n", {"config.json": b"{}"})
        # Asked to come back later than the deadline allows: it stops at once and says so.
        hub.busy.append(Busy("/api/models/o/n/revision", 429, times=5, retry_after="3600"))
        result, elapsed = hub_info(hub, deadline=5)
    repo = result["repos"]["target"]
    assert elapsed < 3, elapsed
    assert repo["access"] == "unreachable" and hub.url in repo["message"]
    assert "429" in repo["message"] and "3600" in repo["message"]


@pytest.mark.timeout(60)
def test_worker_retries_a_busy_hub_and_gives_up_on_a_silent_one(tmp_path):
    from tests.support.hub_server import Busy, LocalHub

    data = {"a.safetensors": os.urandom(1 << 20), "config.json": b'{"x": 1}'}
    with LocalHub() as hub:
        hub.add_repo("o/n", data)
        spec = {
            "repo_id": "o/n",
            "revision": hub.repos["o/n"].sha,
            "local_dir": str(tmp_path / "w"),
            "max_workers": 2,
            "transfer": "http",
            "files": [{"path": name, "size": len(content)} for name, content in data.items()],
            "missing": list(data),
            "timeout_s": 1,
            "retry_s": 10,
        }
        hub.busy += [Busy("/o/n/resolve/", 503, times=2), Busy("/repos/", 429, 1, "1")]
        done = run_worker(spec, hub.url)
        assert done.returncode == 0, done.stderr
        for name, content in data.items():
            assert (tmp_path / "w" / name).read_bytes() == content
        hub.hangs.append("/o/n/resolve/")
        started = time.monotonic()
        silent = run_worker({**spec, "local_dir": str(tmp_path / "w2")}, hub.url)
        elapsed = time.monotonic() - started
    assert silent.returncode not in (0, None)
    assert elapsed < 10, elapsed
    assert hub.url in silent.stderr and "timed out" in silent.stderr


WATCHER = """
import ctypes, os, select, sys, time
path, stop = sys.argv[1], sys.argv[2]
# Woken by the kernel at each change in the token's folder (inotify: created, written, closed,
# moved in, its mode changed, removed), the watcher tries the file at once, within microseconds
# of the write, where a window between creating it and narrowing its mode shows. Against the
# kit's old write (ansible.builtin.copy) it read the token more often than a loop that tries
# without pause, and it leaves the core to the rest of the suite between writes.
libc = ctypes.CDLL(None, use_errno=True)
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE, IN_DELETE = (
    0x2, 0x4, 0x8, 0x80, 0x100, 0x200)
changes = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE
watch = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
if watch < 0 or libc.inotify_add_watch(watch, os.path.dirname(path).encode(), changes) < 0:
    sys.exit("inotify: " + os.strerror(ctypes.get_errno()))
seen = woken = 0
deadline = time.monotonic() + 300
while not os.path.exists(stop) and time.monotonic() < deadline:
    try:
        with open(path, encoding="utf-8") as handle:
            seen += handle.read().startswith("hf_")
    except OSError:
        pass
    if select.select([watch], [], [], 0.2)[0]:
        woken += 1
        try:
            os.read(watch, 65536)
        except BlockingIOError:
            pass
print(seen, woken)
"""


def test_the_token_file_is_never_readable_by_another_user_while_it_is_written(tmp_path):
    """Hardening II (1): ansible.builtin.copy created the token file under the umask (0644) in
    the 0755 state folder and narrowed it after: an unprivileged watcher read the token 43
    times in 40 writes (this one, woken by inotify, 15 and 18 times in 10 writes of that kind).
    Written through server_files, it is 0600 from its creation."""
    import shutil
    import tempfile

    from tests.support.ansible_run import local_playbook

    if os.geteuid() != 0:
        pytest.skip("the watcher runs as another user: the test needs root")
    # Under /tmp, reachable by another user: pytest's own folder is not.
    shared = Path(tempfile.mkdtemp(prefix="kimi-token-watch-"))
    try:
        shared.chmod(0o755)
        state = shared / "state"
        state.mkdir(mode=0o755)
        state.chmod(0o755)
        stop = shared / "stop"
        watcher = subprocess.Popen(
            # The system Python: the checkout's venv need not be open to other users.
            [
                "/usr/bin/python3",
                "-c",
                WATCHER,
                str(state / "hf-token"),
                str(stop),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=shared,
            user=65534,
            group=65534,
        )
        playbook = (
            Path(__file__).resolve().parents[1] / "support" / "playbooks" / "weights_token.yml"
        )
        argv, environ = local_playbook(playbook)
        extra = {"weights_state_dir": str(state), "weights_hf_token": "hf_WatchedToken" + "x" * 30}
        writes = 10
        argv += ["-e", json.dumps({**extra, "token_writes": writes})]
        try:
            done = subprocess.run(
                argv,
                cwd=Path(__file__).resolve().parents[2],
                stdin=subprocess.DEVNULL,
                env=environ,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            stop.touch()
            said, complaint = watcher.communicate(timeout=60)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "hf_WatchedToken" not in done.stdout + done.stderr
        assert watcher.returncode == 0, f"the watcher failed: {complaint[-2000:]}"
        seen, woken = map(int, said.split())
        # Woken by every write and removal: it watched the whole run.
        assert woken >= writes, f"the watcher was woken {woken} times by {writes} writes"
        assert seen == 0, f"another user read the token {seen} times"
    finally:
        shutil.rmtree(shared, ignore_errors=True)
