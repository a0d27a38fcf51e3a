"""Reading the tar archives the kit writes (support bundles, the analysis' bundle) in tests."""

from __future__ import annotations

import tarfile
from pathlib import Path


def read_members(archive: str | Path) -> dict[str, bytes]:
    """Every member's bytes by name, after checking it is a regular file, named once, with a
    relative name that never climbs (".."): what the kit's archives hold, and nothing an
    extraction filter would have to stop."""
    found = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            assert member.isfile(), f"{member.name}: not a regular file"
            name = Path(member.name)
            assert not name.is_absolute() and ".." not in name.parts, (
                f"{member.name} would leave the folder it is unpacked into"
            )
            assert member.name not in found, f"{member.name}: twice in the archive"
            found[member.name] = tar.extractfile(member).read()
    return found


def extract_files(archive: str | Path, into: Path) -> list[str]:
    """read_members written under into (Debian 12's Python, 3.11.2, has no tarfile filter);
    the members' names."""
    members = read_members(archive)
    into.mkdir(parents=True, exist_ok=True)
    for name, data in members.items():
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return list(members)
