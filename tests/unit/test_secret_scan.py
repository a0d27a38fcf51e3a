"""The tests' own secret scanner (tests/support/secret_scan.py): what it reads, and that it
finds every form of a secret wherever it lies in a file others can read."""

from __future__ import annotations

import hashlib
import os

from tests.support import secret_scan
from tests.support.secret_scan import derived_forms, files_under, readable_by_others, scan

SECRET = "hf_scanner_probe_5e2a"
SECRETS = {"HF token": derived_forms(SECRET)}


def write(path, data: bytes, mode: int = 0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_file_others_can_read_is_one_whose_folders_they_can_search_too(tmp_path):
    top = tmp_path / "top"
    shown = write(top / "open" / "deep" / "file", b"x")
    hidden = write(top / "closed" / "deep" / "file", b"x")
    private = write(top / "open" / "private", b"x", 0o600)
    group_root = write(top / "open" / "group-root", b"x", 0o640)
    (top / "closed").chmod(0o700)
    folders: dict = {}
    assert readable_by_others(shown, top, folders)
    assert not readable_by_others(hidden, top, folders)
    assert not readable_by_others(private, top, folders)
    # Readable by root's group only: root's own (gid 0 here, as the tests run).
    assert readable_by_others(group_root, top, folders) is (os.stat(group_root).st_gid != 0)
    # The memo gives each file the verdict a fresh look gives.
    for path in (shown, hidden, private, group_root):
        assert readable_by_others(path, top, folders) == readable_by_others(path, top)


def test_links_and_excluded_paths_are_not_read(tmp_path):
    top = tmp_path / "top"
    kept = write(top / "kept", b"x")
    write(top / "excluded-folder" / "inside", b"x")
    excluded_file = write(top / "excluded-file", b"x")
    (top / "link").symlink_to(kept)
    (top / "folder-link").symlink_to(top / "excluded-folder")
    found = sorted(
        p.name for _top, p in files_under([top], [top / "excluded-folder", excluded_file])
    )
    assert found == ["kept"]


def test_every_form_is_found_in_any_case_and_across_pieces(tmp_path, monkeypatch):
    top = tmp_path / "top"
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    write(top / "plain", b"token=" + SECRET.encode())
    write(top / "upper-hex", b"id " + digest.upper().encode())
    write(top / "clean", b"nothing here")
    write(top / "unreadable", SECRET.encode(), 0o600)
    # A secret across the boundary between two pieces read, at every offset around it.
    monkeypatch.setattr(secret_scan, "CHUNK", 64)
    for offset in range(40, 70):
        write(top / "split" / f"at-{offset}", b"." * offset + SECRET.encode() + b"." * 50)
    leaks, read = scan([top], SECRETS)
    by_file = {}
    for leak in leaks:
        by_file.setdefault(leak.path.name, set()).add(leak.form)
    assert read == 3 + 30
    assert by_file.pop("plain") == {"plain"}
    assert by_file.pop("upper-hex") == {"sha256(secret)"}
    assert all(forms == {"plain"} for forms in by_file.values()) and len(by_file) == 30
    # Where every file counts, the private one is read too.
    leaks, read = scan([top], SECRETS, readable_only=False)
    assert read == 4 + 30 and any(leak.path.name == "unreadable" for leak in leaks)
