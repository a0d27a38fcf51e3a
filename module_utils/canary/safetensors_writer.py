"""The safetensors files of a tiny checkpoint, written with the standard library: each tensor's
bytes from its specification (shake_256 over the seed and its name, deterministic, so the same
inputs give the same bytes on every host), the header, and files written whole or not at all,
never through a symlink."""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import tempfile

from ansible.module_utils.canary.checkpoint_common import checkpoint_error

# Chunks of random bytes: bounds the memory one tensor takes while it is written.
CHUNK = 1 << 24
DTYPE_BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}

# bfloat16 from random bytes, little-endian: the low byte is 7 mantissa bits and the
# exponent's lowest bit, the high byte the sign and the exponent's upper 7 bits. Fixing the
# upper exponent bits to 59 or 60 gives exponents 118..121: |x| in [2^-9, 2^-5), finite,
# never zero or NaN. Scales (positive) take 59 only: [2^-9, 2^-7), so that dequantized INT4
# weights (-8..7 times the scale) stay small too.
HIGH_WEIGHT = bytes((r & 0x80) | (59 + (r & 1)) for r in range(256))
HIGH_SCALE = bytes(59 for _ in range(256))
BF16_ONE = b"\x80\x3f"
F32_ONE = struct.pack("<f", 1.0)


def nbytes(dtype: str, shape: list[int]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


def tensor_chunks(seed: int, name: str, dtype: str, shape: list[int], fill):
    """The tensor's bytes, in chunks of at most CHUNK, as the specification says."""
    total = nbytes(dtype, shape)
    if isinstance(fill, tuple):  # ("int32", values)
        yield struct.pack(f"<{len(fill[1])}i", *fill[1])
        return
    if fill in ("weight", "scale", "packed"):
        high = HIGH_SCALE if fill == "scale" else HIGH_WEIGHT
        for index, start in enumerate(range(0, total, CHUNK)):
            size = min(CHUNK, total - start)
            key = f"kimi-canary-checkpoint\0{seed}\0{name}\0{index}".encode()
            raw = hashlib.shake_256(key).digest(size)
            if fill == "packed":  # every int32 is a valid word of packed INT4/INT8 values
                yield raw
                continue
            out = bytearray(raw)
            out[1::2] = raw[1::2].translate(high)
            yield bytes(out)
        return
    if fill == "a_log":  # A = -exp(A_log) in -1..-16, as Mamba initialises it
        values = [math.log(1 + i % 16) for i in range(shape[0])]
        yield struct.pack(f"<{shape[0]}f", *values)
        return
    unit = {"ones": BF16_ONE if dtype == "BF16" else F32_ONE, "zeros": bytes(DTYPE_BYTES[dtype])}[
        fill
    ]
    count = total // len(unit)
    step = CHUNK // len(unit)
    for start in range(0, count, step):
        yield unit * min(step, count - start)


def safetensors_header(specs: list) -> tuple[bytes, list]:
    """The safetensors header (8-byte little-endian length, then JSON padded with spaces to a
    multiple of 8) and the tensors in file order: widest dtype first, then by name, so every
    tensor starts aligned to its element size, as safetensors' own writer orders them."""
    ordered = sorted(specs, key=lambda s: (-DTYPE_BYTES[s[1]], s[0]))
    entries, offset = {}, 0
    for name, dtype, shape, _fill in ordered:
        size = nbytes(dtype, shape)
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = {"__metadata__": {"format": "pt"}, **dict(sorted(entries.items()))}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, ordered


def safe_target(dest_dir: str, name: str) -> str:
    """The path to write, refusing a symlink at it or at any folder between it and dest_dir:
    the module writes only inside dest_dir and never follows a link out of it."""
    path = dest_dir
    for part in name.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise checkpoint_error(
                f"a symlink at {path}",
                "a regular file, a folder or nothing where the checkpoint writes",
                f"remove {path}; the module writes only its own files and never follows links",
            )
    return path


def write_file(dest_dir: str, name: str, chunks, mode: int = 0o644) -> tuple[int, str]:
    """Writes a file whole or not at all, returning its size and sha256."""
    path = safe_target(dest_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    safe_target(dest_dir, name)  # no link made in between
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return size, digest.hexdigest()


def file_chunks(path: str):
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                return
            yield chunk
