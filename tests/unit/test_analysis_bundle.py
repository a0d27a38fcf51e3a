"""analysis bundle: secrets planted in every kind of file a run holds (JSON, logs, HTML, gzip
members) are gone from the archive, as tests/support/secret_scan finds; links out of the run,
oversized files and unreadable gzip stay home; bad input exits 2."""

from __future__ import annotations

import base64
import gzip
import json
import tarfile
from pathlib import Path

import pytest
from ansible.module_utils.host.secret_scrub import MASK, Scrubber

from analysis.__main__ import main
from tests.support.archives import extract_files
from tests.support.secret_scan import derived_forms, scan

pytestmark = pytest.mark.analysis

API_KEY = "sk-bundle-8d1e6f3a9c2b7e4d0f5a"
HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
OTHER_ENV = "corp-proxy-password-77aa31"
FILE_SECRET = "s3-secret-key-Zq81pLm0"
# Listed nowhere: the patterns find them.
STRAY_HF = "hf_QqWwEeRrTtYyUuIiOoPpAaSsDdFfGgHh12345"
STRAY_BEARER = "eyJhbGciOiJIUzI1NiJ9.stray.bearer"
STRAY_API_KEY = "stray-api-key-5150abcdef"
ALL = {
    "api key": API_KEY,
    "hf token": HF_TOKEN,
    "--secret-env": OTHER_ENV,
    "--secret-file": FILE_SECRET,
    "stray hf": STRAY_HF,
    "stray bearer": STRAY_BEARER,
    "stray api_key": STRAY_API_KEY,
}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run folder with a secret in every kind of file, a link out of it, a huge file."""
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("KIMI_SERVER_API_KEY", API_KEY)
    monkeypatch.setenv("MY_PROXY_PASSWORD", OTHER_ENV)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    root = tmp_path / "20260101T000000Z"
    host = root / "bench-a"
    level_dir = host / "ar" / "gsm8k"
    debug = host / "ar" / "debug"
    report = root / "report"
    for folder in (level_dir, debug, report):
        folder.mkdir(parents=True)
    (root / "run.json").write_text(
        json.dumps({"run_id": root.name, "model": {"name": "k2"}, "note": f"token {HF_TOKEN}"})
    )
    (level_dir / "c1.json").write_text(
        json.dumps(
            {
                "summary": {"output_tokens_per_s": 123.5},
                "provenance": {"records": {"launch": {"environment": {"PROXY": OTHER_ENV}}}},
                "requests": [{"text": f"echo {FILE_SECRET}", "output_len": 7}],
            }
        )
    )
    (host / "lossless.json").write_text(json.dumps({"ok": True, "why": f"api_key={STRAY_API_KEY}"}))
    (host / "ar" / "status.json").write_text(json.dumps({"status": "ok", "api_key": API_KEY}))
    (host / "ar" / "api-check.json").write_text(
        json.dumps({"headers": f"Authorization: Bearer {STRAY_BEARER}"})
    )
    log = (
        f"server_args=ServerArgs(api_key='{API_KEY}', tp_size=8)\n"
        f"fetch https://user:{OTHER_ENV}@hub.example/x\n"
        f"stray {STRAY_HF}\n"
        "[0] NCCL INFO ring 0\n"
    )
    (debug / "server.log.gz").write_bytes(gzip.compress(log.encode()))
    (debug / "nccl.txt").write_text("[0] NCCL INFO ring 0\n")
    bearer = base64.b64encode(f"Bearer {API_KEY}".encode()).decode()
    (report / "report.html").write_text(f"<p>echoed {bearer}</p><p>{API_KEY.upper()}</p>")
    (report / "report.json").write_text(json.dumps({"kind": "analysis.report"}))
    outside = tmp_path / "outside-secret.txt"
    outside.write_text(f"never packed {API_KEY}\n")
    (host / "link-out.txt").symlink_to(outside)
    (host / "link-in.json").symlink_to(host / "lossless.json")
    secret_file = tmp_path / "secrets.txt"
    secret_file.write_text(f"\n{FILE_SECRET}\n")
    return {"root": root, "tmp": tmp_path, "secret_file": secret_file}


def bundle_args(run, out: Path, *more: str) -> list[str]:
    return [
        "bundle",
        str(run["root"]),
        "--out",
        str(out),
        "--secret-env",
        "MY_PROXY_PASSWORD",
        "--secret-file",
        str(run["secret_file"]),
        *more,
    ]


def unpack(archive: Path, into: Path) -> list[str]:
    """Members extracted (gzip ones decompressed beside) after checking every name."""
    names = extract_files(archive, into)
    for path in into.rglob("*.gz"):
        path.with_suffix(".plain").write_bytes(gzip.decompress(path.read_bytes()))
    return names


def forms() -> dict[str, dict[str, bytes]]:
    return {label: derived_forms(value) for label, value in ALL.items()}


def test_scan_finds_the_planted_secrets_before_the_bundle(run):
    for path in run["root"].rglob("*.gz"):
        path.with_suffix(".plain").write_bytes(gzip.decompress(path.read_bytes()))
    leaks, _ = scan([run["root"]], forms(), readable_only=False)
    assert {leak.secret for leak in leaks} == set(ALL)


def test_bundle_leaves_no_secret_and_keeps_the_rest(run, tmp_path, capsys):
    out = tmp_path / "shared" / "run.tar.gz"
    out.parent.mkdir()
    assert main(bundle_args(run, out)) == 0
    printed = capsys.readouterr().out
    assert all(value not in printed for value in ALL.values())
    assert "files" in printed and "values masked (4 secrets given" in printed
    assert "link-out.txt: a link out of the results folder" in printed

    unpacked = tmp_path / "unpacked"
    names = unpack(out, unpacked)
    top = run["root"].name
    assert all(name.startswith(f"{top}/") for name in names)
    assert f"{top}/bench-a/link-out.txt" not in names
    assert f"{top}/bench-a/link-in.json" in names
    assert f"{top}/bench-a/ar/debug/server.log.gz" in names
    assert f"{top}/report/report.html" in names
    leaks, read = scan([unpacked], forms(), readable_only=False)
    assert read == len(names) + 1  # and the decompressed log
    assert leaks == [], [str(leak) for leak in leaks]

    base = unpacked / top
    level = json.loads((base / "bench-a/ar/gsm8k/c1.json").read_text())
    assert level["summary"] == {"output_tokens_per_s": 123.5}
    assert level["requests"] == [{"text": f"echo {MASK}", "output_len": 7}]
    log = (base / "bench-a/ar/debug/server.log.plain").read_text()
    assert f"api_key='{MASK}', tp_size=8" in log and "[0] NCCL INFO ring 0" in log
    assert f"https://user:{MASK}@hub.example/x" in log
    status = json.loads((base / "bench-a/ar/status.json").read_text())
    assert status == {"status": "ok", "api_key": MASK}
    manifest = json.loads((base / "BUNDLE.json").read_text())
    assert manifest["masked_values"] >= len(ALL)
    assert "MY_PROXY_PASSWORD" in manifest["secrets_from"]
    assert {
        "path": "bench-a/link-out.txt",
        "why": "a link out of the results folder: not followed",
    } in manifest["left_out"]


def test_oversized_files_and_unreadable_gzip_stay_home(run, tmp_path, capsys):
    huge = run["root"] / "bench-a" / "huge.log"
    huge.write_bytes(b"x" * 300_000 + f"\n{API_KEY}\n".encode())
    (run["root"] / "bench-a" / "broken.gz").write_bytes(
        b"\x1f\x8bnot really gzip" + API_KEY.encode()
    )
    bomb = run["root"] / "bench-a" / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 2_000_000))
    out = tmp_path / "b.tar.gz"
    assert main(bundle_args(run, out, "--max-file-bytes", "256K")) == 0
    names = unpack(out, tmp_path / "u")
    top = run["root"].name
    for left in ("huge.log", "broken.gz", "bomb.txt.gz"):
        assert f"{top}/bench-a/{left}" not in names
    manifest = json.loads((tmp_path / "u" / top / "BUNDLE.json").read_text())
    why = {entry["path"]: entry["why"] for entry in manifest["left_out"]}
    assert why["bench-a/huge.log"].startswith("over --max-file-bytes")
    assert why["bench-a/broken.gz"].startswith("no readable gzip")
    assert why["bench-a/bomb.txt.gz"].startswith("decompresses past")
    assert scan([tmp_path / "u"], forms(), readable_only=False)[0] == []


def test_total_bound_leaves_the_rest_out(run, tmp_path):
    out = tmp_path / "t.tar.gz"
    assert main(bundle_args(run, out, "--max-bytes", "600")) == 0
    with tarfile.open(out) as tar:
        sizes = [m.size for m in tar.getmembers() if not m.name.endswith("BUNDLE.json")]
        manifest = json.loads(tar.extractfile(f"{run['root'].name}/BUNDLE.json").read())
    assert sum(sizes) <= 600
    assert any(e["why"].startswith("past --max-bytes") for e in manifest["left_out"])


@pytest.mark.parametrize(
    "case, message",
    [
        ("exists", "exists; the bundle never replaces"),
        ("inside", "is inside"),
        ("no-dir", "not a folder"),
        ("unset-env", "NOT_SET_ANYWHERE: the variable is not set"),
        ("no-secret-file", "cannot be read"),
        ("suffix", "ending in .tar.gz"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(run, tmp_path, capsys, case, message):
    out = tmp_path / "x.tar.gz"
    args = bundle_args(run, out)
    if case == "exists":
        out.write_text("keep me")
    elif case == "inside":
        args[3] = str(run["root"] / "x.tar.gz")
    elif case == "no-dir":
        args[1] = str(tmp_path / "missing")
    elif case == "unset-env":
        args += ["--secret-env", "NOT_SET_ANYWHERE"]
    elif case == "no-secret-file":
        args[args.index("--secret-file") + 1] = str(tmp_path / "nope.txt")
    elif case == "suffix":
        args[3] = str(tmp_path / "x.zip")
    assert main(args) == 2
    assert message in capsys.readouterr().err
    if case == "exists":
        assert out.read_text() == "keep me"
    else:
        assert not out.exists()
    assert not (run["root"] / "x.tar.gz").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.tar.gz")] == []


def test_scrubber_patterns():
    scrub = Scrubber([])
    assert scrub.text("api_key=None") == "api_key=None"
    assert scrub.text('"api_key": "v"') == f'"api_key": "{MASK}"'
    assert scrub.text("authorization: Bearer abc.def") == f"authorization: Bearer {MASK}"
    assert scrub.text(f"t={STRAY_HF}!") == f"t={MASK}!"
    assert scrub.count == 3
    binary = bytes(range(256))
    assert Scrubber([API_KEY]).bytes(binary) == binary
