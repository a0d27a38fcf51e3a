"""benchmark_results (module_utils/benchmark/results_transfer.py, library/benchmark_results.py
and its action plugin): a config's files packed on the host in one module run and unpacked on
the controller as outside input."""

from __future__ import annotations

import base64
import io
import os
import random
import stat
import tarfile
import textwrap

import pytest
from ansible.module_utils.benchmark import results_transfer as rt

from tests.support.ansible_run import run_local_playbook
from tests.support.modules import run_module

CAP = 1 << 20


def config_tree(tmp_path):
    """A config's folder as the benchmark leaves it, with things that must never be sent."""
    config = tmp_path / "host" / "run" / "dflash"
    debug = tmp_path / "host" / "run" / "debug" / "dflash"
    (config / "gsm8k").mkdir(parents=True)
    debug.mkdir(parents=True)
    (config / "gsm8k" / "c1.json").write_text('{"level": 1}\n')
    (config / "gsm8k" / "c4.rep2.json").write_text('{"level": 4}\n')
    (config / "gsm8k" / "r20.json").write_text('{"rate": 20}\n')
    (config / "status.json").write_text('{"status": "ok"}\n')
    (config / "api-check.json").write_text('{"passed": true}\n')
    (config / "provenance.json").write_text("{}\n")  # not a pattern: stays on the host
    (config / "gsm8k" / "c9.json").symlink_to("/etc/passwd")  # a link: never followed
    os.mkfifo(config / "gsm8k" / "c8.json")  # not a regular file: never opened to block
    (debug / "server.log.gz").write_bytes(b"\x1f\x8b log")
    (debug / "collected.json").write_text("{}\n")
    (debug / "nested").mkdir()
    (debug / "nested" / "x.txt").write_text("deeper than the debug folder\n")
    (debug / "link.txt").symlink_to("/etc/hostname")
    return config, debug


def test_a_config_s_files_land_where_one_fetch_per_file_put_them(tmp_path):
    config, debug = config_tree(tmp_path)
    packed = rt.pack(str(config), str(debug), rt.PATTERNS, CAP)
    assert [m["name"] for m in packed["members"]] == [
        "results/api-check.json",
        "results/status.json",
        "results/gsm8k/c1.json",
        "results/gsm8k/c4.rep2.json",
        "results/gsm8k/r20.json",
        "debug/collected.json",
        "debug/server.log.gz",
    ]
    left = {os.path.basename(item["path"]): item["why"] for item in packed["left_out"]}
    assert left == {"c8.json": "not a regular file", "c9.json": left["c9.json"]}
    assert "unreadable" in left["c9.json"]  # O_NOFOLLOW refuses the link
    dest = tmp_path / "controller" / "ct200-a" / "dflash"
    result = rt.unpack(rt.decode(packed["archive"], CAP), str(dest), CAP)
    assert sorted(result["written"]) == sorted(
        [
            "api-check.json",
            "status.json",
            "gsm8k/c1.json",
            "gsm8k/c4.rep2.json",
            "gsm8k/r20.json",
            "debug/collected.json",
            "debug/server.log.gz",
        ]
    )
    assert (dest / "gsm8k" / "c4.rep2.json").read_text() == '{"level": 4}\n'
    assert (dest / "debug" / "server.log.gz").read_bytes() == b"\x1f\x8b log"
    assert stat.S_IMODE((dest / "status.json").stat().st_mode) == 0o644
    assert not (dest / "provenance.json").exists() and not (dest / "debug" / "nested").exists()
    # A second run: nothing written; a file that differs is brought again.
    again = rt.unpack(rt.decode(packed["archive"], CAP), str(dest), CAP)
    assert again["written"] == [] and len(again["unchanged"]) == 7
    (dest / "status.json").write_text("stale\n")
    third = rt.unpack(rt.decode(packed["archive"], CAP), str(dest), CAP)
    assert third["written"] == ["status.json"]
    assert (dest / "status.json").read_text() == '{"status": "ok"}\n'
    # Check mode compares and writes nothing.
    (dest / "status.json").write_text("stale\n")
    checked = rt.unpack(rt.decode(packed["archive"], CAP), str(dest), CAP, check_mode=True)
    assert checked["written"] == ["status.json"] and (dest / "status.json").read_text() == "stale\n"


def test_a_missing_folder_sends_nothing_and_a_file_past_the_cap_stays_on_the_host(tmp_path):
    empty = rt.pack(str(tmp_path / "absent"), "", rt.PATTERNS, CAP)
    assert empty["members"] == [] and empty["left_out"] == []
    config = tmp_path / "config"
    config.mkdir()
    (config / "c1.json").write_bytes(b"x" * 600)
    (config / "c4.json").write_bytes(b"y" * 600)
    packed = rt.pack(str(config), "", rt.PATTERNS, 1000)
    assert [m["name"] for m in packed["members"]] == ["results/c1.json"]
    assert packed["left_out"] == [
        {"path": str(config / "c4.json"), "why": "600 bytes, past the 400 bytes left to fetch"}
    ]


def archive_of(*members) -> bytes:
    """A .tar.gz holding the given TarInfo-and-bytes pairs, as a hostile host could send."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, data: bytes = b"{}", kind=tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def test_a_hostile_archive_writes_nothing_outside_its_folder(tmp_path):
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    outside.mkdir()
    hostile = archive_of(
        member("../escape.json"),
        member("/abs/escape.json"),
        member("results/../../escape.json"),
        member("results/.hidden.json"),
        member("other/c1.json"),
        member("debug/deeper/x.txt"),
        member("results/link.json", kind=tarfile.SYMTYPE, link=str(outside / "x")),
        member("results/hard.json", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        member("results/dev.json", kind=tarfile.CHRTYPE),
        member("results/gsm8k", kind=tarfile.DIRTYPE),
        member("results/c1.json", b'{"ok": 1}'),
    )
    result = rt.unpack(hostile, str(dest), CAP)
    assert result["written"] == ["c1.json"]
    assert len(result["left_out"]) == 10
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["c1.json"]
    # A link planted in the destination is never written through.
    (dest / "gsm8k").symlink_to(outside)
    with pytest.raises(rt.TransferError, match="in the way"):
        rt.unpack(archive_of(member("results/gsm8k/c1.json")), str(dest), CAP)
    (dest / "c4.json").symlink_to(outside / "target.json")
    with pytest.raises(rt.TransferError, match="in the way"):
        rt.unpack(archive_of(member("results/c4.json")), str(dest), CAP)
    assert list(outside.iterdir()) == []


def test_content_that_does_not_compress_fills_the_cap_and_still_comes_over(tmp_path):
    """Debug files are gzip already: an archive of them is larger than its content, and one
    that fills the cap exactly must still pass the controller's bound on the archive."""
    config = tmp_path / "config"
    config.mkdir()
    for i in range(40):
        (config / f"c{i}.json").write_bytes(os.urandom(7500))
    packed = rt.pack(str(config), "", rt.PATTERNS, 40 * 7500)
    assert len(packed["members"]) == 40 and len(packed["archive"]) > 4 * 40 * 7500 // 3
    result = rt.unpack(rt.decode(packed["archive"], 40 * 7500), str(tmp_path / "dest"), 40 * 7500)
    assert len(result["written"]) == 40 and result["left_out"] == []


def test_the_caps_hold_against_a_large_or_long_archive(tmp_path, monkeypatch):
    big = archive_of(member("results/c1.json", b"a" * 100), member("results/c4.json", b"b" * 100))
    result = rt.unpack(big, str(tmp_path / "a"), 150)
    assert result["written"] == ["c1.json"] and "past the cap" in result["left_out"][0]["why"]
    monkeypatch.setattr(rt, "MAX_MEMBERS", 40)  # the cap's logic, without 5,000 fsyncs
    many = archive_of(*(member(f"results/c{i}.json") for i in range(rt.MAX_MEMBERS + 5)))
    result = rt.unpack(many, str(tmp_path / "b"), CAP)
    assert len(result["written"]) == rt.MAX_MEMBERS and len(result["left_out"]) == 1
    with pytest.raises(rt.TransferError, match="past the"):
        rt.decode("A" * (rt.archive_chars_limit(CAP) + 1), CAP)
    with pytest.raises(rt.TransferError, match="not base64"):
        rt.decode("not base64 at all!", CAP)
    with pytest.raises(rt.TransferError, match="no archive"):
        rt.decode(None, CAP)
    with pytest.raises(rt.TransferError, match="unreadable"):
        rt.unpack(b"\x1f\x8b\x08\x00garbage", str(tmp_path / "c"), CAP)


def test_a_thousand_mutated_archives_end_inside_the_folder_or_in_a_named_refusal(tmp_path):
    good = archive_of(
        *(member(f"results/gsm8k/c{i}.json", b'{"n": %d}' % i) for i in range(4)),
        member("debug/server.log.gz", b"log"),
    )
    draw = random.Random(33)
    dest = tmp_path / "dest"
    for attempt in range(1000):
        data = bytearray(good)
        for _ in range(draw.randint(1, 8)):
            data[draw.randrange(len(data))] = draw.randrange(256)
        try:
            result = rt.unpack(bytes(data), str(dest), CAP)
        except rt.TransferError as error:
            assert str(error), attempt
            continue
        for name in result["written"] + result["unchanged"]:
            assert (dest / name).resolve().is_relative_to(dest.resolve()), (attempt, name)
    assert {p.parent for p in tmp_path.rglob("*") if p.is_file()} <= {
        dest,
        dest / "gsm8k",
        dest / "debug",
    }


def test_the_module_packs_and_the_action_plugin_unpacks_without_showing_the_archive(tmp_path):
    config, debug = config_tree(tmp_path)
    result = run_module(
        "benchmark_results", {"config_dir": str(config), "debug_dir": str(debug), "max_bytes": CAP}
    )
    assert not result.get("failed") and result["changed"] is False
    names = {m["name"] for m in result["members"]}
    assert "results/gsm8k/c1.json" in names and "debug/server.log.gz" in names
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(result["archive"]))) as tar:
        assert sorted(tar.getnames()) == sorted(names)
    assert run_module("benchmark_results", {"config_dir": str(config), "max_bytes": 0})["failed"]
    dest = tmp_path / "controller" / "dflash"
    playbook = tmp_path / "bring.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: localhost
              connection: local
              gather_facts: false
              tasks:
                - name: Bring the files
                  benchmark_results:
                    config_dir: "{config}"
                    debug_dir: "{debug}"
                    dest: "{dest}"
                  register: first
                - name: Bring them again
                  benchmark_results:
                    config_dir: "{config}"
                    debug_dir: "{debug}"
                    dest: "{dest}"
                    max_bytes: 20
                  register: second
                - name: Show both results
                  ansible.builtin.debug:
                    msg: "FIRST {{{{ first | to_json }}}} SECOND {{{{ second | to_json }}}}"
            """
        )
    )
    run = run_local_playbook(playbook, ANSIBLE_NOCOLOR="1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (dest / "gsm8k" / "c1.json").read_text() == '{"level": 1}\n'
    assert (dest / "debug" / "server.log.gz").is_file()
    shown = run.stdout
    assert '"archive"' not in shown and '"members"' not in shown
    first = shown[shown.index("FIRST") : shown.index("SECOND")]
    assert '"changed": true' in first and '"gsm8k/c1.json"' in first
    second = shown[shown.index("SECOND") :]
    # Past its 20 bytes, the second run brings the first small files and leaves the rest,
    # which the files already on the controller keep, and warns naming what stayed.
    assert '"changed": false' in second and "stayed on the host" in run.stdout + run.stderr


def test_a_folder_made_meanwhile_by_another_transfer_is_taken_as_found(tmp_path, monkeypatch):
    """Two hosts' transfers into one results tree: the one that looked first and creates
    second finds the folder made and puts its file there."""
    folder = tmp_path / "debug"
    real_mkdir = os.mkdir

    def make_first(target, *args, **kwargs):
        if str(target) == str(folder):
            real_mkdir(target, 0o755)  # the other transfer, between this one's look and create
            raise FileExistsError(17, "File exists", str(target))
        return real_mkdir(target, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", make_first)
    target = rt._inside(str(tmp_path), "debug/server.log.gz")
    assert target == str(folder / "server.log.gz") and folder.is_dir()
