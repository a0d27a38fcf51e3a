"""Synthetic fixed-length workloads: names, the model folder's tokenizer files read as untrusted
input (tiktoken.model + tokenizer_config.json, or tokenizer.json), prompts drawn from the
ordinary vocabulary only, reproducible and unique, and benchmark_prompts writing them."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
import requests
from ansible.module_utils.benchmark import workloads
from ansible.module_utils.benchmark.workloads import WorkloadError

from tests.support.models import KIMI_SPECIALS, write_kimi_tokenizer
from tests.support.modules import run_module
from tests.support.sim_process import BASE, start, stop

pytestmark = pytest.mark.benchmark

REVISION = "0123456789abcdef0123456789abcdef01234567"


def kimi_folder(path: Path, ranks: int = 300, specials: int = 4) -> Path:
    """A K2.6-shaped folder: tiktoken.model with `ranks` tokens, the special ids above them in
    tokenizer_config.json's added_tokens_decoder, and the weights manifest."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(f't{i}'.encode()).decode()} {i}" for i in range(ranks)]
    (path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    decoder = {str(ranks + i): {"content": f"<|s{i}|>", "special": True} for i in range(specials)}
    (path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    (path / "kimi-manifest.json").write_text(json.dumps({"revision": REVISION, "files": {}}))
    return path


def qwen_folder(path: Path, size: int = 200, added: tuple = (0, 5, 199, 200, 201)) -> Path:
    """A tokenizer.json folder: model.vocab 0..size-1, some of it (and more) added tokens."""
    path.mkdir(parents=True, exist_ok=True)
    data = {
        "model": {"type": "BPE", "vocab": {f"p{i}": i for i in range(size)}},
        "added_tokens": [{"id": i, "content": f"<a{i}>", "special": i > 100} for i in added],
    }
    (path / "tokenizer.json").write_text(json.dumps(data))
    return path


def read_rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.mark.parametrize(
    ("name", "lengths"),
    [
        ("isl1024-osl1024", (1024, 1024)),
        ("isl8192-osl1024", (8192, 1024)),
        ("isl1-osl1", (1, 1)),
        ("isl1048576-osl131072", (1_048_576, 131_072)),
    ],
)
def test_good_names(name, lengths):
    assert workloads.parse_name(name) == lengths


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("isl0-osl8", "out of bounds"),
        ("isl1048577-osl8", "out of bounds"),
        ("isl8-osl131073", "out of bounds"),
        ("isl08-osl8", "not a workload name"),
        ("ISL8-OSL8", "not a workload name"),
        ("isl8-osl8 ", "not a workload name"),
        ("isl8_osl8", "not a workload name"),
        ("isl-8-osl8", "not a workload name"),
        ("gsm8k", "not a workload name"),
        ("isl" + "9" * 5000 + "-osl1", "not a workload name"),
        ("", "not a workload name"),
        (1024, "is a int"),
        (None, "is a NoneType"),
    ],
)
def test_bad_names_say_what_was_found_and_the_form_needed(name, said):
    with pytest.raises(WorkloadError) as raised:
        workloads.parse_name(name)
    message = str(raised.value)
    assert said in message and repr(name) in message
    assert "isl<N>-osl<M>" in message and "isl1024-osl1024" in message
    assert "1048576" in message and "131072" in message


def test_tiktoken_folder_draws_only_ordinary_ids(tmp_path):
    folder = kimi_folder(tmp_path / "k", ranks=300, specials=4)
    # A special id inside the ranks too (some tokenizers mark a rank special): excluded.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["7"] = {"content": "<|seven|>", "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = workloads.load_tokenizer(str(folder))
    assert tokenizer["file"] == "tiktoken.model"
    assert tokenizer["ordinary"] == [i for i in range(300) if i != 7]
    assert tokenizer["revision"] == REVISION
    data = (folder / "tiktoken.model").read_bytes()
    assert tokenizer["sha256"] == hashlib.sha256(data).hexdigest()
    rows = [json.loads(line) for _, line in workloads.rows_of("isl50-osl4", 200, tokenizer)]
    drawn = {i for row in rows for i in row["input_ids"]}
    assert drawn <= set(tokenizer["ordinary"])
    assert 7 not in drawn and not drawn & set(range(300, 304))
    # 200 rows of 50 draws from 299 ids: nearly every ordinary id shows up.
    assert len(drawn) > 290


def test_tokenizer_json_folder_excludes_added_and_decoder_ids(tmp_path):
    folder = qwen_folder(tmp_path / "q", size=200, added=(0, 5, 199, 200, 201))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {"9": {"content": "<x>"}}})
    )
    tokenizer = workloads.load_tokenizer(str(folder))
    assert tokenizer["file"] == "tokenizer.json"
    assert tokenizer["revision"] is None  # no kimi-manifest.json
    assert tokenizer["ordinary"] == [i for i in range(200) if i not in (0, 5, 9, 199)]
    rows = [json.loads(line) for _, line in workloads.rows_of("isl64-osl2", 150, tokenizer)]
    drawn = {i for row in rows for i in row["input_ids"]}
    assert drawn <= set(tokenizer["ordinary"]) and not drawn & {0, 5, 9, 199, 200, 201}


def test_unigram_vocab_is_read_by_position(tmp_path):
    folder = tmp_path / "u"
    folder.mkdir()
    data = {
        "model": {"type": "Unigram", "vocab": [[f"p{i}", -1.0] for i in range(30)]},
        "added_tokens": [{"id": 2, "content": "<s>"}],
    }
    (folder / "tokenizer.json").write_text(json.dumps(data))
    assert workloads.load_tokenizer(str(folder))["ordinary"] == [i for i in range(30) if i != 2]


def test_tiktoken_wins_over_tokenizer_json(tmp_path):
    folder = kimi_folder(tmp_path / "both", ranks=40)
    qwen_folder(folder, size=10, added=())
    assert workloads.load_tokenizer(str(folder))["file"] == "tiktoken.model"


def test_rows_are_exact_reproducible_unique_and_prefix_stable(tmp_path):
    tokenizer = workloads.load_tokenizer(str(kimi_folder(tmp_path / "k", ranks=300)))
    name = "isl100-osl16"
    rows = [json.loads(line) for _, line in workloads.rows_of(name, 250, tokenizer)]
    again = [json.loads(line) for _, line in workloads.rows_of(name, 250, tokenizer)]
    fewer = [json.loads(line) for _, line in workloads.rows_of(name, 40, tokenizer)]
    other = [json.loads(line) for _, line in workloads.rows_of("isl100-osl17", 40, tokenizer)]
    assert rows == again
    assert fewer == rows[:40]
    assert [row["id"] for row in rows] == list(range(250))
    assert all(len(row["input_ids"]) == 100 for row in rows)
    # Every row starts with its own id: no two share even a first token, so none shares
    # its first 64 with another and the radix cache serves none from another.
    assert len({row["input_ids"][0] for row in rows}) == 250
    assert len({tuple(row["input_ids"][:64]) for row in rows}) == 250
    # Another name draws other prompts (the seed is the name's).
    assert other != rows[:40]
    assert workloads.seed_of(name) == workloads.seed_of(name) != workloads.seed_of("isl100-osl17")


def test_more_rows_than_distinct_first_ids_or_too_many_ids_are_refused(tmp_path):
    tokenizer = workloads.load_tokenizer(str(kimi_folder(tmp_path / "k", ranks=20)))
    with pytest.raises(WorkloadError, match="21 prompts need as many distinct first tokens"):
        workloads.check_rows("isl4-osl4", 21, tokenizer)
    assert workloads.check_rows("isl4-osl4", 20, tokenizer) == 20
    for rows in (0, -1, True, 1.5, workloads.MAX_ROWS + 1):
        with pytest.raises(WorkloadError, match="prompts; 1 to"):
            workloads.check_rows("isl4-osl4", rows, tokenizer)
    big = {**tokenizer, "ordinary": list(range(200_000))}
    with pytest.raises(WorkloadError, match="ask for fewer prompts"):
        workloads.check_rows("isl1048576-osl1", 200, big)


def test_missing_tokenizer_names_the_files_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError) as raised:
        workloads.load_tokenizer(str(tmp_path / "empty"))
    assert "tiktoken.model" in str(raised.value) and "tokenizer.json" in str(raised.value)
    with pytest.raises(WorkloadError, match="does not exist"):
        workloads.load_tokenizer(str(tmp_path / "nowhere"))


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("dDA= 0\n!!notbase64!! 1\n", "line 2: '!!notbase64!!' is not base64"),
        ("dDA= 0\ndDE= one\n", "line 2: rank 'one' is not a non-negative integer"),
        ("dDA= 0\ndDE= -1\n", "rank '-1' is not a non-negative integer"),
        ("dDA= 0\ndDE= 1.5\n", "rank '1.5' is not"),
        ("dDA= 0\ndDE= 99999999\n", "is not an integer 0..16777215"),
        ("dDA= 0\ndDE=\n", "line 2: not `<base64 bytes> <rank>`"),
        ("dDA= 0\ndDE= 1 2\n", "line 2: not `<base64 bytes> <rank>`"),
        ("dDA= 0\ndDE= 0\n", "line 2: rank 0 or its bytes appear twice"),
        ("dDA= 0\ndDA= 1\n", "line 2: rank 1 or its bytes appear twice"),
        ("dDA= 0\n" + "A" * 5000 + " 1\n", "line 2: not `<base64 bytes> <rank>`"),
        ("\n\n", "no tokens"),
        ("dDA= 0\nd\u00e9= 1\n", "not ASCII"),
    ],
)
def test_hostile_tiktoken_files_are_refused_with_the_line(tmp_path, content, said):
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "tiktoken.model").write_bytes(content.encode())
    with pytest.raises(WorkloadError) as raised:
        workloads.load_tokenizer(str(folder))
    assert said in str(raised.value)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"model": {"vocab": {"a": "1"}}}, "token id '1' is not an integer"),
        ({"model": {"vocab": {"a": True}}}, "token id True is not an integer"),
        ({"model": {"vocab": {"a": -3}}}, "token id -3 is not an integer"),
        ({"model": {"vocab": "a b c"}}, "no model.vocab"),
        ({"model": {}}, "no model.vocab"),
        ([1, 2], "no model.vocab"),
        ({"model": {"vocab": {}}}, "model.vocab is empty"),
        ({"model": {"vocab": {"a": 1}}, "added_tokens": {"id": 1}}, "added_tokens is not a list"),
        ({"model": {"vocab": {"a": 1}}, "added_tokens": [3]}, "added_tokens[0] is not an object"),
        ({"model": {"vocab": {"a": 1}}, "added_tokens": [{"id": "1"}]}, "added_tokens[0].id"),
        ({"model": {"vocab": {"a": 1}}, "added_tokens": [{"id": 1}]}, "every token id is special"),
    ],
)
def test_hostile_tokenizer_json_is_refused(tmp_path, data, said):
    folder = tmp_path / "q"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(WorkloadError) as raised:
        workloads.load_tokenizer(str(folder))
    assert said in str(raised.value)


def test_unparsable_json_files_are_refused(tmp_path):
    folder = qwen_folder(tmp_path / "q")
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(WorkloadError, match=r"tokenizer_config\.json: not JSON"):
        workloads.load_tokenizer(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {"x": {}}}))
    with pytest.raises(WorkloadError, match="key 'x' is no token id"):
        workloads.load_tokenizer(str(folder))
    (folder / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(WorkloadError, match="not JSON"):
        workloads.load_tokenizer(str(folder))


def test_huge_files_are_refused_unread(tmp_path, monkeypatch):
    folder = kimi_folder(tmp_path / "k", ranks=10)
    monkeypatch.setattr(workloads, "MAX_TOKENIZER_BYTES", 64)
    with pytest.raises(WorkloadError, match=r"tokenizer_config\.json holds more than 64 bytes"):
        workloads.load_tokenizer(str(folder))
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(WorkloadError, match=r"tiktoken\.model holds more than 64 bytes"):
        workloads.load_tokenizer(str(folder))
    monkeypatch.setattr(workloads, "MAX_TOKENIZER_BYTES", 1 << 20)
    monkeypatch.setattr(workloads, "MAX_TIKTOKEN_LINES", 5)
    with pytest.raises(WorkloadError, match="more than 5 lines"):
        workloads.load_tokenizer(str(folder))


def test_real_size_bound_refuses_a_file_past_64_mib(tmp_path):
    folder = tmp_path / "k"
    folder.mkdir()
    with open(folder / "tiktoken.model", "wb") as handle:
        handle.truncate(workloads.MAX_TOKENIZER_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(WorkloadError, match="holds more than 67108864 bytes"):
        workloads.load_tokenizer(str(folder))


def test_symlinks_out_of_the_folder_are_refused_inside_ones_read(tmp_path):
    outside = kimi_folder(tmp_path / "outside", ranks=30)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tiktoken.model").symlink_to(outside / "tiktoken.model")
    with pytest.raises(WorkloadError, match="leads outside the model folder"):
        workloads.load_tokenizer(str(folder))
    (folder / "tiktoken.model").unlink()
    (folder / "blobs").mkdir()
    (outside / "tiktoken.model").rename(folder / "blobs" / "abc")
    (folder / "tiktoken.model").symlink_to(Path("blobs") / "abc")
    assert len(workloads.load_tokenizer(str(folder))["ordinary"]) == 30
    # A config that leads out is refused as well, not skipped.
    (folder / "tokenizer_config.json").symlink_to(outside / "tokenizer_config.json")
    with pytest.raises(WorkloadError, match=r"tokenizer_config\.json leads outside"):
        workloads.load_tokenizer(str(folder))
    (folder / "tokenizer_config.json").unlink()
    # A folder that is itself a link is followed: the files are confined to where it leads.
    (tmp_path / "link").symlink_to(folder)
    assert len(workloads.load_tokenizer(str(tmp_path / "link"))["ordinary"]) == 30


def test_a_directory_or_fifo_in_place_of_the_file_is_refused(tmp_path):
    folder = tmp_path / "k"
    (folder / "tiktoken.model").mkdir(parents=True)
    with pytest.raises(WorkloadError, match=r"tiktoken\.model is not a regular file"):
        workloads.load_tokenizer(str(folder))
    # A FIFO would block a plain open() forever: refused at once.
    (folder / "tiktoken.model").rmdir()
    os.mkfifo(folder / "tiktoken.model")
    with pytest.raises(WorkloadError, match=r"tiktoken\.model is not a regular file"):
        workloads.load_tokenizer(str(folder))


def test_a_manifest_revision_is_recorded_only_when_it_is_a_commit(tmp_path):
    folder = kimi_folder(tmp_path / "k", ranks=10)
    assert workloads.manifest_revision(str(folder)) == REVISION
    for manifest in ('{"revision": "main"}', "[1]", "{broken", '{"revision": 5}'):
        (folder / "kimi-manifest.json").write_text(manifest)
        assert workloads.manifest_revision(str(folder)) is None
    (folder / "kimi-manifest.json").unlink()
    assert workloads.manifest_revision(str(folder)) is None


def module_args(tmp_path: Path, model: Path, **extra) -> dict:
    return {
        "output_dir": str(tmp_path / "out"),
        "cache_dir": str(tmp_path / "cache"),
        "model_dir": str(model),
        "workloads": ["isl32-osl8", "isl8-osl32"],
        "workload_prompts": 12,
        **extra,
    }


def test_benchmark_prompts_writes_workloads_idempotently(tmp_path):
    """Without prompt sets or a chat template: each workload's rows and meta, returned under
    sets like a prompt set; a second run rewrites nothing; a changed tokenizer rewrites it."""
    model = kimi_folder(tmp_path / "model", ranks=500)
    args = module_args(tmp_path, model)
    first = run_module("benchmark_prompts", args)
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] is True
    result = first["sets"]["isl32-osl8"]
    output = tmp_path / "out" / "isl32-osl8.jsonl"
    assert result["output"] == str(output) and result["prompts"] == 12
    assert result["changed"] is True and result["scoring"] is None
    rows = read_rows(str(output))
    assert [row["id"] for row in rows] == list(range(12))
    assert all(len(row["input_ids"]) == 32 and set(row) == {"id", "input_ids"} for row in rows)
    meta = json.loads((tmp_path / "out" / "isl32-osl8.meta.json").read_text())
    tiktoken_sha = workloads.load_tokenizer(str(model))["sha256"]
    assert meta["workload"] == {
        "name": "isl32-osl8",
        "isl": 32,
        "osl": 8,
        "ignore_eos": True,
        "tokenizer": {"file": "tiktoken.model", "sha256": tiktoken_sha, "revision": REVISION},
        "seed": workloads.seed_of("isl32-osl8"),
    }
    assert {k: v for k, v in result.items() if k != "changed"} == meta
    assert meta["sha256"] == workloads.file_sha256(str(output))
    other = read_rows(str(tmp_path / "out" / "isl8-osl32.jsonl"))
    assert all(len(row["input_ids"]) == 8 for row in other)

    stamp = os.stat(output).st_mtime_ns
    second = run_module("benchmark_prompts", args)
    assert second["changed"] is False and not second["sets"]["isl32-osl8"]["changed"]
    assert os.stat(output).st_mtime_ns == stamp

    # Another tokenizer (fewer tokens): other ids, so the file is rewritten.
    kimi_folder(model, ranks=400)
    third = run_module("benchmark_prompts", args)
    assert third["changed"] is True
    assert read_rows(str(output)) != rows
    # A file edited by hand is put back.
    output.write_text('{"id": 0, "input_ids": [1]}\n')
    assert run_module("benchmark_prompts", args)["sets"]["isl32-osl8"]["changed"] is True
    assert len(read_rows(str(output))) == 12


def test_benchmark_prompts_refuses_bad_workloads_clearly(tmp_path):
    model = kimi_folder(tmp_path / "model", ranks=50)
    bad = run_module("benchmark_prompts", module_args(tmp_path, model, workloads=["isl32"]))
    assert bad["failed"] and "isl<N>-osl<M>" in bad["msg"] and "'isl32'" in bad["msg"]
    many = run_module("benchmark_prompts", module_args(tmp_path, model, workload_prompts=51))
    assert many["failed"] and "distinct first tokens" in many["msg"]
    bare = tmp_path / "bare"
    bare.mkdir()
    missing = run_module("benchmark_prompts", module_args(tmp_path, bare))
    assert missing["failed"] and "looked for tiktoken.model" in missing["msg"]
    neither = run_module("benchmark_prompts", module_args(tmp_path, model, workloads=[]))
    assert neither["failed"] and "no workloads" in neither["msg"]
    clash = module_args(tmp_path, model, files={"isl32-osl8": str(tmp_path / "x.jsonl")})
    clashed = run_module("benchmark_prompts", clash)
    assert clashed["failed"] and "share a name: isl32-osl8" in clashed["msg"]


def test_workload_rows_decode_exactly_their_lengths_against_the_simulator(tmp_path):
    """The rows benchmark_prompts writes from a K2.6-shaped folder, sent as SGLang takes them
    (input_ids, max_new_tokens = osl, ignore_eos), are taken whole: prompt_tokens = isl and
    exactly osl tokens come back, finish_reason length."""
    model = write_kimi_tokenizer(tmp_path / "model", ranks=3000, revision=REVISION)
    args = module_args(tmp_path, model, workloads=["isl40-osl9"], workload_prompts=6)
    made = run_module("benchmark_prompts", args)
    assert not made.get("failed"), made.get("msg")
    meta = made["sets"]["isl40-osl9"]
    assert meta["workload"]["tokenizer"]["revision"] == REVISION
    rows = read_rows(meta["output"])
    assert not {i for row in rows for i in row["input_ids"]} & set(KIMI_SPECIALS)
    process, url = start(BASE, SGLANG_SIM_STEP_MS=2)
    try:
        answers = []
        for row in rows:
            body = {
                "input_ids": row["input_ids"],
                "sampling_params": {
                    "max_new_tokens": meta["workload"]["osl"],
                    "ignore_eos": meta["workload"]["ignore_eos"],
                    "temperature": 0,
                },
            }
            answers.append(requests.post(f"{url}/generate", json=body, timeout=30).json())
    finally:
        stop(process)
    for answer in answers:
        info = answer["meta_info"]
        assert info["prompt_tokens"] == 40 and info["completion_tokens"] == 9
        assert info["finish_reason"] == {"type": "length", "length": 9}
        assert info["cached_tokens"] == 0  # no row is a prefix the cache has seen
