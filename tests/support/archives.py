"""Unpacking the tar archives the kit writes (support bundles, the analysis' bundle) in tests."""

from __future__ import annotations

import tarfile
from pathlib import Path


def extract_files(archive: str | Path, into: Path) -> list[str]:
    """Every member of archive written under into, after checking it is a regular file whose
    name stays inside: what the kit's archives hold, and nothing an extraction filter would
    have to stop (Debian 12's Python, 3.11.2, has no tarfile filter). The members' names."""
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    names = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            assert member.isfile(), f"{member.name}: not a regular file"
            target = (root / member.name).resolve()
            assert not Path(member.name).is_absolute() and target.is_relative_to(root), (
                f"{member.name} leaves {into}"
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            names.append(member.name)
    return names
