"""Synthetic fixed-length workloads (`isl<N>-osl<M>`): prompts of exactly N token ids drawn from
the model's own tokenizer files, each asking for exactly M output tokens (ignore_eos).

Runs on the GPU host under the runtime's Python, so it reads the tokenizer files itself with
the standard library (no tiktoken, no tokenizers): only the set of ordinary token ids is
needed, never an encoding. Two layouts are read, the first found wins:

    tiktoken.model        Kimi K2.x: one `<base64 token bytes> <rank>` a line, as tiktoken's
                          load_tiktoken_bpe reads it; tokenizer_config.json's
                          added_tokens_decoder names the special ids (K2.6's sit above the
                          ranks, 163584.., in a 163840 vocabulary)
    tokenizer.json        Hugging Face tokenizers (Qwen and most others): model.vocab (a map
                          piece -> id, or Unigram's list of [piece, score]) and added_tokens

The files come from a download and are treated as untrusted: read only inside the model
folder (a symlink out of it is refused), at most MAX_TOKENIZER_BYTES each, lines and ids
bounded and type-checked.

Prompts: row k's first id is the k-th of a seeded shuffle of the ordinary ids, so no two rows
share even their first token and the radix cache cannot serve one row from another; its other
isl - 1 ids are drawn uniformly (with replacement) by random.Random seeded from the
workload's seed and k. Special and added ids are never drawn: a chat-control token in the
middle of a prompt could change how the model reads it. Ordinary ids whose bytes are not
valid UTF-8 on their own are kept: the ids go to the server as ids and are never decoded and
re-tokenized, so they cannot change the prompt's length. This is SGLang 0.5.23's own practice
(benchmark/datasets/common.py gen_prompt_ids: random.choices over the sorted vocabulary ids;
its multimodal variant leaves the special ids out, as here). The same name, row count and
tokenizer give the same file, and the first rows of a longer file are those of a shorter one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import random
import re
import stat
import tempfile

from ansible.module_utils.host.helpers import atomic_write, file_sha256, read_json

MAX_ISL = 1_048_576
MAX_OSL = 131_072
NAME = re.compile(r"^isl(\d{1,8})-osl(\d{1,8})$")
EXAMPLE = "isl1024-osl1024"

MAX_TOKENIZER_BYTES = 64 << 20
MAX_TIKTOKEN_LINES = 2_000_000
MAX_TIKTOKEN_LINE_CHARS = 4096
MAX_TOKEN_ID = (1 << 24) - 1  # far above any released vocabulary (K2.6: 163840)
MAX_ADDED_TOKENS = 1_000_000
MAX_ROWS = 100_000
# A workload file's ids (rows x isl): 200 M ids are about 1.4 GB of JSON lines.
MAX_TOTAL_IDS = 200_000_000

TIKTOKEN, TOKENIZER_JSON, TOKENIZER_CONFIG = (
    "tiktoken.model",
    "tokenizer.json",
    "tokenizer_config.json",
)
MANIFEST = "kimi-manifest.json"
REVISION = re.compile(r"^[0-9a-f]{40}$")


class WorkloadError(ValueError):
    pass


def parse_name(name: object) -> tuple[int, int]:
    """(isl, osl) of a workload name, or WorkloadError saying what was found and what is
    needed."""
    form = (
        f"the form is isl<N>-osl<M>, N input tokens (1 to {MAX_ISL}) and M output tokens "
        f"(1 to {MAX_OSL}), for example {EXAMPLE}"
    )
    if not isinstance(name, str):
        raise WorkloadError(f"workload {name!r} is a {type(name).__name__}, not a name: {form}")
    match = NAME.match(name)
    if match is None or any(len(part) > 1 and part[0] == "0" for part in match.groups()):
        raise WorkloadError(f"workload {name!r} is not a workload name: {form}")
    isl, osl = int(match.group(1)), int(match.group(2))
    if not 1 <= isl <= MAX_ISL or not 1 <= osl <= MAX_OSL:
        raise WorkloadError(f"workload {name!r} is out of bounds: {form}")
    return isl, osl


def seed_of(name: str) -> int:
    """The workload's seed: from its name alone, so every host and config draws the same
    prompts."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def read_confined(folder: str, name: str) -> bytes | None:
    """The bytes of folder/name, None when it does not exist; WorkloadError when it resolves
    outside the folder, is no regular file or is larger than MAX_TOKENIZER_BYTES."""
    root = os.path.realpath(folder)
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        return None
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise WorkloadError(f"{path} leads outside the model folder ({real}); refused")
    try:
        # Non-blocking: a FIFO planted in place of the file must not hang the module.
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(real, flags)
    except OSError as error:
        raise WorkloadError(f"{path}: cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WorkloadError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_TOKENIZER_BYTES + 1)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise WorkloadError(
            f"{path} holds more than {MAX_TOKENIZER_BYTES} bytes; no tokenizer file does"
        )
    return data


def token_id(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_ID:
        raise WorkloadError(f"{where}: token id {value!r:.40} is not an integer 0..{MAX_TOKEN_ID}")
    return value


def json_of(data: bytes, path: str) -> object:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise WorkloadError(f"{path}: not JSON ({str(error)[:120]})") from None


def added_decoder_ids(config: object, path: str) -> set[int]:
    """The ids tokenizer_config.json's added_tokens_decoder lists ({"<id>": {...}})."""
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if decoder is None:
        return set()
    if not isinstance(decoder, dict) or len(decoder) > MAX_ADDED_TOKENS:
        raise WorkloadError(
            f"{path}: added_tokens_decoder is not a map of at most {MAX_ADDED_TOKENS} ids"
        )
    ids = set()
    for key in decoder:
        if not key.isdigit() or len(key) > 8:
            raise WorkloadError(f"{path}: added_tokens_decoder key {key!r:.40} is no token id")
        ids.add(token_id(int(key), f"{path} added_tokens_decoder"))
    return ids


def tiktoken_ranks(data: bytes, path: str) -> set[int]:
    """The ranks of a tiktoken BPE file, every line checked: base64 bytes, a space, a rank."""
    ranks: set[int] = set()
    seen: set[bytes] = set()
    if not data.isascii():
        raise WorkloadError(f"{path}: not ASCII, so no tiktoken file")
    # Split as tiktoken's load_tiktoken_bpe does (bytes.splitlines: \n and \r only).
    for number, raw in enumerate(data.splitlines(), 1):
        line = raw.decode("ascii")
        if number > MAX_TIKTOKEN_LINES:
            raise WorkloadError(f"{path}: more than {MAX_TIKTOKEN_LINES} lines")
        if not line:
            continue
        where = f"{path} line {number}"
        parts = line.split()
        if len(line) > MAX_TIKTOKEN_LINE_CHARS or len(parts) != 2:
            raise WorkloadError(f"{where}: not `<base64 bytes> <rank>` ({line[:60]!r})")
        encoded, rank = parts
        try:
            token = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise WorkloadError(f"{where}: {encoded[:40]!r} is not base64") from None
        if not rank.isdigit() or len(rank) > 8:
            raise WorkloadError(f"{where}: rank {rank[:40]!r} is not a non-negative integer")
        value = token_id(int(rank), where)
        if value in ranks or token in seen:
            raise WorkloadError(f"{where}: rank {value} or its bytes appear twice")
        ranks.add(value)
        seen.add(token)
    if not ranks:
        raise WorkloadError(f"{path}: no tokens")
    return ranks


def tokenizer_json_ids(data: object, path: str) -> tuple[set[int], set[int]]:
    """(vocabulary ids, added token ids) of a Hugging Face tokenizer.json."""
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        ids = {token_id(value, f"{path} model.vocab") for value in vocab.values()}
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        ids = set(range(len(vocab)))
        if len(vocab) > MAX_TOKEN_ID:
            raise WorkloadError(f"{path}: model.vocab has more than {MAX_TOKEN_ID} pieces")
    else:
        raise WorkloadError(f"{path}: no model.vocab (a map of piece to id, or a list)")
    if not ids:
        raise WorkloadError(f"{path}: model.vocab is empty")
    added = data.get("added_tokens") or []
    if not isinstance(added, list) or len(added) > MAX_ADDED_TOKENS:
        raise WorkloadError(f"{path}: added_tokens is not a list of at most {MAX_ADDED_TOKENS}")
    added_ids = set()
    for index, entry in enumerate(added):
        if not isinstance(entry, dict):
            raise WorkloadError(f"{path}: added_tokens[{index}] is not an object")
        added_ids.add(token_id(entry.get("id"), f"{path} added_tokens[{index}].id"))
    return ids, added_ids


def load_tokenizer(model_dir: str) -> dict:
    """{"file", "sha256", "revision", "ordinary": sorted ids, "excluded": count}: the model
    folder's ordinary (non-special, non-added) token ids and where they came from."""
    if not os.path.isdir(model_dir):
        raise WorkloadError(f"model folder {model_dir} does not exist")
    config_path = os.path.join(model_dir, TOKENIZER_CONFIG)
    config_data = read_confined(model_dir, TOKENIZER_CONFIG)
    special = set()
    if config_data is not None:
        special = added_decoder_ids(json_of(config_data, config_path), config_path)
    data = read_confined(model_dir, TIKTOKEN)
    if data is not None:
        name = TIKTOKEN
        ids = tiktoken_ranks(data, os.path.join(model_dir, TIKTOKEN))
    else:
        data = read_confined(model_dir, TOKENIZER_JSON)
        if data is None:
            raise WorkloadError(
                f"no tokenizer in {model_dir}: looked for {TIKTOKEN} (with {TOKENIZER_CONFIG}) "
                f"and {TOKENIZER_JSON}; the weights stage puts the model's files there"
            )
        name = TOKENIZER_JSON
        path = os.path.join(model_dir, TOKENIZER_JSON)
        ids, added = tokenizer_json_ids(json_of(data, path), path)
        special |= added
    ordinary = sorted(ids - special)
    if not ordinary:
        raise WorkloadError(f"{model_dir}/{name}: every token id is special; none to draw from")
    return {
        "file": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "revision": manifest_revision(model_dir),
        "ordinary": ordinary,
        "excluded": len(ids) - len(ordinary),
    }


def manifest_revision(model_dir: str) -> str | None:
    """The commit kimi-manifest.json says the weights were verified at, when it names one."""
    try:
        data = read_confined(model_dir, MANIFEST)
        manifest = json_of(data, MANIFEST) if data is not None else None
    except WorkloadError:
        return None
    revision = manifest.get("revision") if isinstance(manifest, dict) else None
    return revision if isinstance(revision, str) and REVISION.match(revision) else None


def describe(name: str, tokenizer: dict) -> dict:
    """The `workload` block of the .meta.json and of every level file."""
    isl, osl = parse_name(name)
    return {
        "name": name,
        "isl": isl,
        "osl": osl,
        "ignore_eos": True,
        "tokenizer": {
            "file": tokenizer["file"],
            "sha256": tokenizer["sha256"],
            "revision": tokenizer["revision"],
        },
        "seed": seed_of(name),
    }


def check_rows(name: str, rows: object, tokenizer: dict) -> int:
    isl, _ = parse_name(name)
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        raise WorkloadError(f"workload {name}: {rows!r} prompts; 1 to {MAX_ROWS} are possible")
    if rows > len(tokenizer["ordinary"]):
        raise WorkloadError(
            f"workload {name}: {rows} prompts need as many distinct first tokens, and "
            f"{tokenizer['file']} has {len(tokenizer['ordinary'])} ordinary ids"
        )
    if rows * isl > MAX_TOTAL_IDS:
        raise WorkloadError(
            f"workload {name}: {rows} prompts of {isl} ids are {rows * isl} ids, more than "
            f"{MAX_TOTAL_IDS} in one file; ask for fewer prompts"
        )
    return rows


def rows_of(name: str, rows: int, tokenizer: dict):
    """Yields (k, JSON line) for rows 0..rows-1, each line `{"id": k, "input_ids": [...]}`."""
    isl, _ = parse_name(name)
    seed = seed_of(name)
    words = [str(i) for i in tokenizer["ordinary"]]
    # A partial Fisher-Yates shuffle: row k's first id depends on k alone, not on `rows`.
    firsts = random.Random(f"{name}/{seed}/first")  # noqa: S311 - reproducible, not secret
    for k in range(rows):
        j = firsts.randrange(k, len(words))
        words[k], words[j] = words[j], words[k]
        rest = random.Random(f"{name}/{seed}/{k}").choices(words, k=isl - 1)  # noqa: S311
        yield k, f'{{"id":{k},"input_ids":[{",".join([words[k], *rest])}]}}\n'


def write_workload(name: str, rows: int, tokenizer: dict, output_dir: str) -> dict:
    """Writes <output_dir>/<name>.jsonl and <name>.meta.json; returns the meta plus
    `changed`. An existing file whose meta and content hash still match is left alone
    without drawing it again."""
    check_rows(name, rows, tokenizer)
    workload = describe(name, tokenizer)
    output = os.path.join(output_dir, f"{name}.jsonl")
    meta_path = os.path.join(output_dir, f"{name}.meta.json")
    meta = {
        "name": name,
        "source": {"workload": name},
        "prompts": rows,
        "scoring": None,
        "output": output,
        "workload": workload,
    }
    old = read_json(meta_path)
    if (
        isinstance(old, dict)
        and {k: old.get(k) for k in meta} == meta
        and isinstance(old.get("sha256"), str)
        and os.path.isfile(output)
        and file_sha256(output) == old["sha256"]
    ):
        return {**meta, "sha256": old["sha256"], "changed": False}
    os.makedirs(output_dir, mode=0o755, exist_ok=True)
    digest = hashlib.sha256()
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.jsonl.", dir=output_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            for _, line in rows_of(name, rows, tokenizer):
                data = line.encode()
                digest.update(data)
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        meta["sha256"] = digest.hexdigest()
        changed = not os.path.isfile(output) or file_sha256(output) != meta["sha256"]
        if changed:
            os.chmod(temporary, 0o644)
            os.replace(temporary, output)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
    if changed or old != meta:
        atomic_write(meta_path, json.dumps(meta, indent=1), 0o644)
    return {**meta, "changed": changed}
