"""The wheelhouse as one archive (module_utils/host/wheelhouse.py): packed once on the
controller, unpacked on the host writing only what differs, hostile archives refused."""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path

import pytest
from ansible.module_utils.host import wheelhouse


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    for index in range(5):
        (folder / f"pkg{index}-1.0-py3-none-any.whl").write_bytes(os.urandom(2000 + index))
    (folder / "sub").mkdir()
    (folder / "sub" / "extra-2.0.tar.gz").write_bytes(b"sdist")
    return folder


def unpacked(dest):
    return {
        str(path.relative_to(dest)): path.read_bytes()
        for path in sorted(dest.rglob("*"))
        if path.is_file() and path.name != wheelhouse.RECORD
    }


def originals(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_pack_writes_once_and_a_changed_file_makes_a_new_archive(wheels, tmp_path):
    cache = tmp_path / "cache"
    first = wheelhouse.pack(str(wheels), str(cache))
    again = wheelhouse.pack(str(wheels), str(cache))
    assert first["written"] and not again["written"]
    assert first["path"] == again["path"] and first["files"] == 6
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    with tarfile.open(first["path"]) as archive:
        assert sorted(archive.getnames()) == sorted(originals(wheels))
        assert {m.uid for m in archive} == {0} and {m.mode for m in archive} == {0o644}
    (wheels / "pkg0-1.0-py3-none-any.whl").write_bytes(b"rebuilt")
    changed = wheelhouse.pack(str(wheels), str(cache))
    assert changed["written"] and changed["path"] != first["path"]


def test_pack_keeps_only_the_most_recent_archives(wheels, tmp_path):
    cache = tmp_path / "cache"
    paths = []
    for index in range(wheelhouse.KEEP_ARCHIVES + 2):
        (wheels / "pkg0-1.0-py3-none-any.whl").write_bytes(b"v%d" % index)
        result = wheelhouse.pack(str(wheels), str(cache))
        os.utime(result["path"], (1000 + index, 1000 + index))
        paths.append(result["path"])
    left = sorted(str(p) for p in cache.glob("wheelhouse-*.tar"))
    assert len(left) == wheelhouse.KEEP_ARCHIVES
    assert paths[0] not in left and paths[-1] in left


@pytest.mark.parametrize("case", ["missing", "empty", "file"])
def test_pack_names_a_folder_that_is_no_wheelhouse(case, tmp_path):
    src = tmp_path / "wheels"
    if case == "empty":
        src.mkdir()
    elif case == "file":
        src.write_text("x")
    with pytest.raises(wheelhouse.WheelhouseError, match=str(src)) as error:
        wheelhouse.pack(str(src), str(tmp_path / "cache"))
    assert "Fix:" in str(error.value)


def test_unpack_writes_everything_then_nothing_then_only_what_changed(wheels, tmp_path):
    archive = wheelhouse.pack(str(wheels), str(tmp_path / "cache"))["path"]
    dest = tmp_path / "host" / "wheelhouse"
    first = wheelhouse.unpack(archive, str(dest))
    assert first["changed"] and len(first["written"]) == 6
    assert unpacked(dest) == originals(wheels)
    assert {oct(p.stat().st_mode & 0o777) for p in dest.rglob("*.whl")} == {"0o644"}
    assert wheelhouse.unpack(archive, str(dest)) == {"changed": False, "written": []}
    (dest / "pkg1-1.0-py3-none-any.whl").write_bytes(b"damaged")
    (dest / "pkg2-1.0-py3-none-any.whl").unlink()
    (dest / "pkg3-1.0-py3-none-any.whl").chmod(0o600)
    (dest / "left-over.whl").write_bytes(b"kept")
    repaired = wheelhouse.unpack(archive, str(dest))
    assert sorted(repaired["written"]) == [
        "pkg1-1.0-py3-none-any.whl",
        "pkg2-1.0-py3-none-any.whl",
        "pkg3-1.0-py3-none-any.whl",
    ]
    assert unpacked(dest) == {**originals(wheels), "left-over.whl": b"kept"}
    assert not wheelhouse.unpack(archive, str(dest))["changed"]


def test_a_lost_record_costs_a_read_but_no_change(wheels, tmp_path):
    archive = wheelhouse.pack(str(wheels), str(tmp_path / "cache"))["path"]
    dest = tmp_path / "wheelhouse"
    wheelhouse.unpack(archive, str(dest))
    (dest / wheelhouse.RECORD).write_text("{not json")
    assert wheelhouse.unpack(archive, str(dest)) == {"changed": False, "written": []}


def test_check_mode_names_what_would_be_written_and_writes_nothing(wheels, tmp_path):
    archive = wheelhouse.pack(str(wheels), str(tmp_path / "cache"))["path"]
    dest = tmp_path / "wheelhouse"
    result = wheelhouse.unpack(archive, str(dest), check=True)
    assert result["changed"] and len(result["written"]) == 6
    assert not dest.exists()


def hostile(tmp_path, members) -> str:
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return str(path)


def entry(name, kind=tarfile.REGTYPE, data=b"x", link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize(
    "members",
    [
        [entry("../escape.whl")],
        [entry("/etc/escape.whl")],
        [entry("a/../../escape.whl")],
        [entry("ok.whl"), entry("link.whl", tarfile.SYMTYPE, link="/etc/passwd")],
        [entry("hard.whl", tarfile.LNKTYPE, link="/etc/passwd")],
        [entry("dev", tarfile.CHRTYPE)],
        [entry("fifo", tarfile.FIFOTYPE)],
        [entry("a\\b.whl")],
        [entry("/".join(["d"] * (wheelhouse.MAX_DEPTH + 1)))],
    ],
    ids=[
        "dotdot",
        "absolute",
        "nested-dotdot",
        "symlink",
        "hardlink",
        "device",
        "fifo",
        "backslash",
        "deep",
    ],
)
def test_a_hostile_archive_is_refused_before_anything_is_written(members, tmp_path):
    dest = tmp_path / "host" / "wheelhouse"
    with pytest.raises(wheelhouse.WheelhouseError):
        wheelhouse.unpack(hostile(tmp_path, members), str(dest))
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.tar"]


def test_a_link_in_the_wheelhouse_does_not_lead_out(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(wheelhouse.WheelhouseError, match="leads out"):
        wheelhouse.unpack(hostile(tmp_path, [entry("sub/evil.whl")]), str(dest))
    assert list(outside.iterdir()) == []


def test_a_link_where_a_wheel_goes_is_replaced_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    (dest / "pkg.whl").symlink_to(target)
    wheelhouse.unpack(hostile(tmp_path, [entry("pkg.whl", data=b"wheel")]), str(dest))
    assert target.read_bytes() == b"keep me"
    assert not (dest / "pkg.whl").is_symlink() and (dest / "pkg.whl").read_bytes() == b"wheel"


def test_more_members_than_the_bound_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "MAX_FILES", 3)
    members = [entry(f"p{index}.whl") for index in range(4)]
    with pytest.raises(wheelhouse.WheelhouseError, match="more than 3 files"):
        wheelhouse.unpack(hostile(tmp_path, members), str(tmp_path / "wheelhouse"))


def test_random_and_truncated_archives_end_in_a_named_refusal(wheels, tmp_path):
    good = Path(wheelhouse.pack(str(wheels), str(tmp_path / "cache"))["path"]).read_bytes()
    rng = random.Random(7)
    broken = tmp_path / "broken.tar"
    for trial in range(150):
        data = bytearray(good)
        if trial % 3 == 0:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randrange(1, 40)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        broken.write_bytes(bytes(data))
        dest = tmp_path / f"dest{trial}"
        try:
            wheelhouse.unpack(str(broken), str(dest))
        except wheelhouse.WheelhouseError:
            continue
        # What unpacked stays inside dest.
        assert all(dest in path.resolve().parents for path in dest.rglob("*"))
