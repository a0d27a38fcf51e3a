"""A .tar.gz written whole or not at all, and the regular-file members it holds.

The support bundle (diagnose/pack.py, on the controller) and the analysis bundle
(analysis/bundle.py) both write an archive others will read: under a temporary name beside the
target, synced, then hard-linked into place, so the target is whole or absent and a file that
appeared meanwhile is never replaced. Standard library only: it ships to the hosts.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import tempfile


def add_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: float) -> None:
    """A regular file member of the given mode and time, owned by nobody in particular."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(mtime)
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


class PartialArchive:
    """A .tar.gz under a temporary name in `folder` (prefix, random part, suffix), published
    onto its target once complete. Creating it raises OSError when the folder cannot take the
    file; publish() raises FileExistsError when the target exists. discard() removes the
    temporary name whatever happened: call it in a finally."""

    def __init__(self, folder: str, prefix: str, suffix: str = ""):
        self._fd, self.path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)

    @contextlib.contextmanager
    def tar(self):
        """The archive open for writing members; on leaving, every byte is on disk."""
        with os.fdopen(self._fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                yield tar
            # After the tar's end blocks and the gzip trailer: the whole archive is synced.
            raw.flush()
            os.fsync(raw.fileno())

    def publish(self, target: str, mode: int) -> None:
        """The complete archive, of the given mode, linked to target; a link never replaces a
        file, so a target that exists raises FileExistsError and is left as it is."""
        os.chmod(self.path, mode)
        os.link(self.path, target)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
