"""The archive both bundles write (module_utils/host/archive.py): members as given, a target
whole or absent, never replacing a file, no temporary name left behind."""

from __future__ import annotations

import os
import stat
import tarfile

import pytest
from ansible.module_utils.host.archive import PartialArchive, add_member


def members(path) -> list[tuple]:
    with tarfile.open(path, mode="r:gz") as tar:
        return [
            (info.name, info.mode, info.mtime, info.uname, info.gname, tar.extractfile(info).read())
            for info in tar.getmembers()
        ]


def written(tmp_path, name: str = "out.tar.gz", mode: int = 0o640):
    partial = PartialArchive(str(tmp_path), prefix=".out.", suffix=".partial")
    try:
        with partial.tar() as tar:
            add_member(tar, "run/a.json", b"{}", 0o600, 12.9)
            add_member(tar, "run/b.txt", b"bee", 0o644, 0)
        partial.publish(str(tmp_path / name), mode)
    finally:
        partial.discard()
    return tmp_path / name


def test_members_keep_their_names_modes_and_whole_second_times(tmp_path):
    target = written(tmp_path)
    assert members(target) == [
        ("run/a.json", 0o600, 12, "", "", b"{}"),
        ("run/b.txt", 0o644, 0, "", "", b"bee"),
    ]
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tar.gz"]


def test_a_target_that_exists_is_left_as_it_is(tmp_path):
    (tmp_path / "out.tar.gz").write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        written(tmp_path)
    assert (tmp_path / "out.tar.gz").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tar.gz"]


def test_a_failure_while_writing_leaves_nothing(tmp_path):
    partial = PartialArchive(str(tmp_path), prefix=".out.")
    assert os.path.dirname(partial.path) == str(tmp_path)
    with pytest.raises(RuntimeError), partial.tar() as tar:
        add_member(tar, "run/a.json", b"{}", 0o600, 0)
        raise RuntimeError("stop")
    partial.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_take_the_file_raises_at_once(tmp_path):
    with pytest.raises(OSError):
        PartialArchive(str(tmp_path / "absent"), prefix=".out.")
