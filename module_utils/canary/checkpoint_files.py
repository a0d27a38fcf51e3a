"""The files of a tiny checkpoint's inputs: the names it writes, the paths it is given (checked
and confined to their folders), the source repository's small files it copies, and the bounded
JSON reads of a config or a stamp (module_utils/canary/checkpoint.py)."""

from __future__ import annotations

import json
import os
import stat

from ansible.module_utils.canary.checkpoint_common import checkpoint_error

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
STAMP = ".kimi-canary-checkpoint.json"
# Never copied from the source: weights and their indexes (this checkpoint has its own).
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".safetensors.index.json",
    ".bin.index.json",
)
# The canary stage fetches at most 64 MiB per file (kimi_canary_source_max_file_bytes); the
# largest real small file is a tokenizer.json of about 20 MB.
COPY_MAX_FILE_BYTES = 64 << 20
COPY_MAX_FILES = 512
CONFIG_MAX_BYTES = 4 << 20
STAMP_MAX_BYTES = 4 << 20


def read_json(path: str, what: str, limit: int = CONFIG_MAX_BYTES):
    """A JSON file, bounded, refusing a symlink and anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise checkpoint_error(
            f"no {os.path.basename(path)} in {os.path.dirname(path)}",
            f"the {what}",
            "fetch the repository's small files into that folder first (the canary stage does)",
        ) from None
    except OSError as exc:
        raise checkpoint_error(
            f"{path} unreadable ({exc.strerror})",
            f"the {what} as a regular file (not a symlink)",
            "replace it with the repository's own file",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise checkpoint_error(f"{path} is not a regular file", f"the {what}", "replace it")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise checkpoint_error(
            f"{path} over {limit} bytes", f"the {what}", "replace it with the real one"
        )
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise checkpoint_error(
            f"{path} is not JSON ({type(exc).__name__})",
            f"the {what}",
            "fetch the repository's config.json again",
        ) from None


def check_path(name: str, path) -> str:
    if not isinstance(path, str) or not path:
        raise checkpoint_error(f"{name} {path!r}", "an absolute path", f"set {name}")
    if not os.path.isabs(path) or os.path.normpath(path) != path.rstrip("/") or "\0" in path:
        raise checkpoint_error(
            f"{name} {path!r}",
            "an absolute, normalised path (no '..', no '.' components)",
            f"give {name} as an absolute path",
        )
    return path.rstrip("/") or "/"


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def confined(path: str, folder: str) -> str:
    """The file to read for path: itself, or where its symlink points when that is inside
    folder; a link that leaves folder is refused."""
    resolved = os.path.realpath(path)
    if not inside(resolved, os.path.realpath(folder)):
        raise checkpoint_error(
            f"{path}, a symlink to {resolved}, outside {folder}",
            "every file of the source inside its folder",
            f"replace the link with the file itself, or remove {path}",
        )
    return resolved


def _skip_linked_folders(root: str, dirs: list, source_dir: str, real_root: str) -> None:
    """Leaves the folder links out of the walk (their files are copied from where they are),
    refusing one that points outside source_dir."""
    for entry in list(dirs):
        full = os.path.join(root, entry)
        if os.path.islink(full):
            if not inside(os.path.realpath(full), real_root):
                raise checkpoint_error(
                    f"{full}, a symlink to {os.path.realpath(full)}, outside {source_dir}",
                    "every file of the source inside its folder",
                    f"replace the link with the files themselves, or remove {full}",
                )
            dirs.remove(entry)


def _small_file(full: str, source_dir: str) -> str:
    """The path to read for one file to copy: a regular file inside source_dir, not too big."""
    resolved = confined(full, source_dir)
    info = os.stat(resolved)
    if not stat.S_ISREG(info.st_mode):
        raise checkpoint_error(
            f"{full}, not a regular file", "regular files only", f"remove {full}"
        )
    if info.st_size > COPY_MAX_FILE_BYTES:
        raise checkpoint_error(
            f"{full} of {info.st_size} bytes",
            f"small files of at most {COPY_MAX_FILE_BYTES} bytes",
            "leave weights and large files out of the source folder",
        )
    return resolved


def source_files(source_dir: str) -> list[tuple[str, str]]:
    """(relative name, path to read) of every small file of the repository to copy: all but
    weights, their indexes, config.json (the tiny one replaces it) and hidden entries (a hub
    client's .cache/). A symlink must resolve inside source_dir."""
    real_root = os.path.realpath(source_dir)
    found: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(source_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        _skip_linked_folders(root, dirs, source_dir, real_root)
        for entry in sorted(files):
            full = os.path.join(root, entry)
            rel = os.path.relpath(full, source_dir)
            if entry.startswith(".") or rel == CONFIG or entry.endswith(WEIGHT_SUFFIXES):
                continue
            found.append((rel, _small_file(full, source_dir)))
            if len(found) > COPY_MAX_FILES:
                raise checkpoint_error(
                    f"more than {COPY_MAX_FILES} files in {source_dir}",
                    "a repository's small files",
                    "point source_dir at the repository's small files only",
                )
    return found
