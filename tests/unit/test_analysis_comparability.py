"""Issue 20 part 3: `python -m analysis compare` says whether two runs are comparable, one
warning per differing field, on result trees with known differences
(tests/support/results_tree.py)."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from analysis import comparability
from analysis.__main__ import main
from analysis.comparability_facts import launch_flags
from analysis.comparability_values import MAX_SHOWN
from analysis.results import load
from tests.support.results_tree import QWEN, Plan, Sim, write_run

pytestmark = pytest.mark.analysis

# Small runs: a release config and a git (DDTree) one, one level each.
CONFIGS = {"ar": Sim(), "ddtree-b16": Sim(step_ms=28.0, accept=6.0, budget=16)}
SMALL = {"configs": CONFIGS, "concurrency": (1,), "num_prompts": 4}
WORKLOAD = {
    "name": "isl64-osl32",
    "isl": 64,
    "osl": 32,
    "ignore_eos": True,
    "tokenizer": {"file": "tiktoken.model", "sha256": "0" * 64, "revision": None},
    "seed": 0,
}


def run(tmp_path: Path, name: str, **plan) -> Path:
    return write_run(tmp_path / name, Plan(**{**SMALL, "run_id": name, **plan}))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def compared(tmp_path: Path, a: Path, b: Path, name: str = "out", *flags: str):
    """(exit status, stdout, report.json's comparability warnings, the output folder)."""
    out = tmp_path / name
    status, stdout, _err = cli("compare", str(a), str(b), "--out", str(out), *flags)
    document = json.loads((out / "report.json").read_text())
    found = [w for w in document["warnings"] if w["kind"] in comparability.KINDS]
    return status, stdout, found, out


def check(a: Path, b: Path) -> list[dict]:
    return comparability.check(load(a), load(b))


def fields(found: list[dict]) -> list[tuple[str, str]]:
    return [(w["kind"], w["field"]) for w in found]


# -- the cases -------------------------------------------------------------------


def test_one_changed_setting_is_one_not_comparable_warning_and_exit_3(tmp_path):
    a = run(tmp_path, "a", max_new_tokens=64)
    b = run(tmp_path, "b", max_new_tokens=128)
    status, stdout, found, out = compared(tmp_path, a, b, "strict", "--require-comparable")
    assert status == 3
    assert fields(found) == [("not_comparable", "settings.max_new_tokens")]
    (only,) = found
    assert only["severity"] == "warning" and only["where"] == "settings.max_new_tokens"
    assert (only["a"], only["b"]) == (64, 128)
    assert "max_new_tokens: A 64, B 128" in only["message"]
    assert "comparability: 1 not_comparable, 0 expected_difference" in stdout
    # The output is written before the exit status says no.
    document = json.loads((out / "report.json").read_text())
    assert document["comparability"] == {"not_comparable": 1, "expected_difference": 0}
    section = (out / "compare.html").read_text().split('id="comparability"')[1]
    section = section.split("</section>")[0]
    assert "Not comparable (1)" in section and "settings.max_new_tokens" in section
    assert "settings.max_new_tokens: A 64, B 128" in (out / "compare.md").read_text()
    status, _stdout, again, _out = compared(tmp_path, a, b, "plain")
    assert status == 0 and again == found


def test_identical_settings_give_no_warning_whatever_the_run_ids_and_host_names(tmp_path):
    a = run(tmp_path, "a", hosts={"node-a": "ct200"})
    b = run(tmp_path, "b", hosts={"node-b": "ct200"}, seed=7, jitter=0.2)
    status, stdout, found, out = compared(tmp_path, a, b, "out", "--require-comparable")
    assert (status, found) == (0, [])
    assert "comparability: 0 not_comparable, 0 expected_difference" in stdout
    section = (out / "compare.html").read_text().split('id="comparability"')[1]
    assert "None: both runs used the same settings" in section.split("</section>")[0]


def test_each_differing_setting_is_its_own_warning(tmp_path):
    a = run(tmp_path, "a", num_prompts=4, max_new_tokens=64)
    b = run(tmp_path, "b", num_prompts=8, max_new_tokens=128)
    found = check(a, b)
    assert fields(found) == [
        ("not_comparable", "settings.max_new_tokens"),
        ("not_comparable", "settings.num_prompts"),
    ]
    assert "num_prompts: A 4, B 8" in found[1]["message"]


def test_another_prompts_file_is_one_warning(tmp_path):
    a = run(tmp_path, "a")
    other = {name: replace(sim, prompts_variant="v2") for name, sim in CONFIGS.items()}
    b = run(tmp_path, "b", configs=other)
    (found,) = check(a, b)
    assert (found["kind"], found["field"]) == ("not_comparable", "prompts[gsm8k].sha256")
    load_a = load(a)
    sha_a = load_a.levels[0].provenance["prompts"]["sha256"]
    assert found["a"] == sha_a and found["b"] != sha_a
    assert sha_a[:20] in found["message"]


def test_a_changed_launch_flag_is_one_warning_with_the_diff(tmp_path):
    a = run(tmp_path, "a", launch_args=("--mem-fraction-static", "0.85"))
    b = run(tmp_path, "b", launch_args=("--mem-fraction-static", "0.8", "--enable-foo"))
    (found,) = check(a, b)
    # A kit-wide change is one warning naming every config it touches.
    assert (found["kind"], found["field"]) == ("not_comparable", "launch[ar,ddtree-b16].argv")
    assert found["configs"] == ["ar", "ddtree-b16"]
    assert found["a"] == {"--enable-foo": "(absent)", "--mem-fraction-static": "0.85"}
    assert found["b"] == {"--enable-foo": "(set)", "--mem-fraction-static": "0.8"}
    assert "--mem-fraction-static A 0.85, B 0.8" in found["message"]
    assert "--enable-foo A absent, B (set)" in found["message"]


def test_a_flag_changed_in_one_config_names_that_config(tmp_path):
    a = run(tmp_path, "a")
    b = run(
        tmp_path,
        "b",
        configs={**CONFIGS, "ddtree-b16": replace(CONFIGS["ddtree-b16"], draft_tokens=6)},
    )
    (found,) = check(a, b)
    assert found["field"] == "launch[ddtree-b16].argv"
    assert set(found["a"]) == {"--speculative-num-draft-tokens", "--speculative-dflash-block-size"}
    assert "--speculative-num-draft-tokens A 8, B 6" in found["message"]


def test_argv_order_address_paths_and_the_api_key_are_not_differences():
    one = ["/opt/a/bin/python", "-m", "sglang.launch_server", "--model-path", "/w/a"]
    one += ["--tp-size", "8", "--host", "10.0.0.1", "--port", "30000", "--api-key", "k1"]
    one += ["--enable-metrics"]
    two = ["/srv/b/python", "-m", "sglang.launch_server", "--enable-metrics", "--api-key=k2"]
    two += ["--port=31000", "--tp-size=8", "--model-path", "/mnt/elsewhere", "--host", "::"]
    repos = {"target": "moonshotai/Kimi-K2.6"}
    assert launch_flags(one, "release", repos) == launch_flags(two, "release", repos)
    flags = launch_flags(one, "release", repos)
    assert flags == {
        "--model-path": "moonshotai/Kimi-K2.6",
        "--tp-size": "8",
        "--api-key": "********",
        "--enable-metrics": "(set)",
        "(runtime)": "release",
    }
    # A flag given twice is its values in any order.
    assert launch_flags(["--x", "1", "--x", "2"]) == launch_flags(["--x", "2", "--x", "1"])


def test_an_nccl_variable_is_one_warning_and_secrets_are_compared_masked(tmp_path):
    secret_a, secret_b = "hf_" + "Qa7" * 12, "hf_" + "Qb7" * 12
    a = run(tmp_path, "a", launch_environment={"NCCL_ALGO": "ring", "HF_TOKEN": secret_a})
    b = run(tmp_path, "b", launch_environment={"NCCL_ALGO": "tree", "HF_TOKEN": secret_b})
    status, _stdout, found, out = compared(tmp_path, a, b, "out", "--require-comparable")
    assert status == 3
    (only,) = found
    assert only["field"] == "launch[ar,ddtree-b16].environment"
    assert (only["a"], only["b"]) == ({"NCCL_ALGO": "ring"}, {"NCCL_ALGO": "tree"})
    assert "NCCL_ALGO A ring, B tree" in only["message"]
    # (The launch record holds secrets masked already; a planted one is not repeated here.)
    section = (out / "compare.html").read_text().split('id="comparability"')[1]
    for text in (
        json.dumps(found),
        section.split("</section>")[0],
        (out / "compare.md").read_text(),
    ):
        assert secret_a not in text and secret_b not in text


def test_the_runtime_versions_folder_in_the_launch_environment_is_no_difference(tmp_path):
    """KIMI_RUNTIME_DIR names the runtime version's folder (a local path; the runtime itself
    is compared as its packages): another folder, or a run from before it existed, is none."""
    a = run(tmp_path, "a", launch_environment={"NCCL_ALGO": "ring"})
    b = run(
        tmp_path,
        "b",
        launch_environment={"NCCL_ALGO": "ring", "KIMI_RUNTIME_DIR": "/opt/kimi/runtimes/r-1"},
    )
    assert check(a, b) == []


def test_other_gpus_an_attention_backend_and_another_model_are_expected(tmp_path):
    configs = {"ar": Sim(), "dflash": Sim(step_ms=26.0, accept=5.0)}
    a = run(tmp_path, "a", configs=configs, launch_args=("--attention-backend", "flashinfer"))
    b = run(
        tmp_path,
        "b",
        configs=configs,
        hosts={"nv-1": "h200"},
        gpu_facts={"count": 4},
        launch_args=("--attention-backend", "fa3", "--speculative-draft-attention-backend", "fa3"),
    )
    status, stdout, found, _out = compared(tmp_path, a, b, "out", "--require-comparable")
    assert status == 0
    assert fields(found) == [
        ("expected_difference", "launch[ar,dflash].attention_backend"),
        ("expected_difference", "gpu.count"),
        ("expected_difference", "gpu.interconnect"),
        ("expected_difference", "gpu.models"),
    ]
    backend = found[0]
    assert backend["a"] == {
        "--attention-backend": "flashinfer",
        "--speculative-draft-attention-backend": "(absent)",
    }
    assert "comparability: 0 not_comparable, 4 expected_difference" in stdout
    assert (found[1]["a"], found[1]["b"]) == (8, 4)
    assert (found[3]["a"], found[3]["b"]) == (
        ["NVIDIA RTX PRO 6000 Blackwell Server Edition"],
        ["NVIDIA H200"],
    )
    model = check(
        a,
        run(
            tmp_path,
            "qwen",
            configs=configs,
            model=QWEN,
            launch_args=("--attention-backend", "flashinfer"),
        ),
    )
    assert fields(model) == [("expected_difference", "model")]
    assert model[0]["b"] == {"name": "qwen3.6-27b", "target": "Qwen/Qwen3.6-27B"}


def test_fewer_gpus_of_the_same_kind_and_another_driver_are_not_comparable(tmp_path):
    a = run(tmp_path, "a")
    b = run(tmp_path, "b", gpu_facts={"count": 4, "driver_version": "575.1"})
    assert fields(check(a, b)) == [
        ("not_comparable", "gpu.count"),
        ("not_comparable", "gpu.driver_version"),
    ]


def test_runtime_weights_and_a_lock_feed_their_fields(tmp_path):
    a = run(tmp_path, "a", runtime_packages={"torch": "2.9.0", "sglang": "0.5.23"})
    b = run(
        tmp_path,
        "b",
        runtime_packages={"torch": "2.9.1", "sglang": "0.5.23"},
        git_commit="9" * 40,
        target_revision="e" * 40,
    )
    found = check(a, b)
    assert fields(found) == [
        ("not_comparable", "weights[moonshotai/Kimi-K2.6].revision"),
        ("not_comparable", "runtime.git.commit"),
        ("not_comparable", "runtime.packages.git"),
        ("not_comparable", "runtime.packages.release"),
    ]
    packages = found[3]
    assert packages["a"]["count"] == 1 and packages["a"]["sha256"] != packages["b"]["sha256"]
    # SGLang itself is its own field (release or commit), not part of the package set.
    c = run(tmp_path, "c", runtime_packages={"torch": "2.9.0", "sglang": "0.5.24"})
    assert check(a, c) == []
    # A study lock recorded in run.json feeds the same fields.
    record = json.loads((c / "run.json").read_text())
    record["lock"] = {"weights": {"moonshotai/Kimi-K2.6": {"revision": "f" * 40}}}
    (c / "run.json").write_text(json.dumps(record))
    (locked,) = check(a, c)
    assert locked["field"] == "weights[moonshotai/Kimi-K2.6].revision"
    assert locked["b"] == ["a" * 40, "f" * 40]


# Each runtime's packages as the levels' runtime record has them (pip's own tooling and SGLang
# included, names as pip spells them), and as the study lock has them (LOCK.md: PEP 503 names,
# version and sha256, without pip's tooling).
LEVEL_PACKAGES = {"torch": "2.9.0", "Zope.Interface": "7.2", "pip": "25.1", "sglang": "0.5.23"}
TORCH_SHA256, ZOPE_SHA256 = "1" * 64, "2" * 64


def study_lock(torch=("2.9.0", TORCH_SHA256), python="3.12.3", driver="580.95.05", **sections):
    """run.json `lock` as the benchmark role writes it (roles/benchmark/tasks/main.yml);
    `torch` is the release runtime's (the git runtime keeps 2.9.0)."""

    def runtime(torch, built_from):
        return {
            "built_from": built_from,
            "python": python,
            "platform": {"driver": driver, "driver_cuda": "13.0"},
            "hashes": "complete",
            "packages": {
                "torch": {"version": torch[0], "sha256": torch[1]},
                "zope-interface": {"version": "7.2", "sha256": ZOPE_SHA256},
            },
        }

    return {
        "file": "/srv/kit/kimi.lock.yml",
        "weights": {"moonshotai/Kimi-K2.6": {"requested": "main", "revision": "a" * 40}},
        "datasets": {"HuggingFaceH4/mt_bench_prompts": {"requested": "main", "revision": "d" * 40}},
        "git": {"sglang": {"ref": "refs/pull/29907/head", "commit": "c" * 40}},
        "runtime": {
            "release": runtime(torch, {"sglang": "0.5.23"}),
            "git": runtime(("2.9.0", TORCH_SHA256), {"commit": "c" * 40, "patches": []}),
        },
        **sections,
    }


def locked_run(tmp_path: Path, name: str, lock: dict | None, **plan) -> Path:
    root = run(tmp_path, name, runtime_packages=plan.pop("packages", LEVEL_PACKAGES), **plan)
    record = json.loads((root / "run.json").read_text())
    record["lock"] = lock
    (root / "run.json").write_text(json.dumps(record))
    return root


def test_two_locks_one_package_version_apart_are_one_warning_and_identical_ones_none(tmp_path):
    a = locked_run(tmp_path, "a", study_lock())
    assert check(a, locked_run(tmp_path, "same", study_lock())) == []
    b = locked_run(tmp_path, "b", study_lock(torch=("2.9.1", "3" * 64)))
    (found,) = check(a, b)
    assert (found["kind"], found["field"]) == ("not_comparable", "runtime.packages.release")
    assert found["message"].startswith("runtime.packages.release: A ")
    # A: its hosts ran what it locked, one set of two packages (torch, zope-interface) with
    # their sha256. B: the lock's set, and its hosts' (torch 2.9.0, versions only), which the
    # lock does not hold.
    assert (found["a"]["count"], found["a"]["hashes"]) == (2, 2)
    hosts, locked = sorted(found["b"], key=lambda value: value["hashes"])
    assert (hosts["hashes"], locked["hashes"]) == (0, 2)
    assert hosts["versions_sha256"] == found["a"]["versions_sha256"] != locked["versions_sha256"]


def test_a_rebuilt_wheel_of_the_same_version_is_another_package_set(tmp_path):
    a = locked_run(tmp_path, "a", study_lock())
    b = locked_run(tmp_path, "b", study_lock(torch=("2.9.0", "9" * 64)))
    (found,) = check(a, b)
    assert found["field"] == "runtime.packages.release"
    assert found["a"]["versions_sha256"] == found["b"]["versions_sha256"]


def test_a_set_known_without_hashes_compares_by_versions(tmp_path):
    a = locked_run(tmp_path, "a", study_lock())
    # No lock (a run before issue 20): its hosts' versions alone, which are the same.
    assert check(a, locked_run(tmp_path, "unlocked", None)) == []
    # An older lock's name -> version form.
    older = study_lock()
    for entry in older["runtime"].values():
        entry["packages"] = {"torch": "2.9.0", "zope_interface": "7.2"}
    assert check(a, locked_run(tmp_path, "older", older)) == []
    older["runtime"]["release"]["packages"]["torch"] = "2.9.1"
    found = check(a, locked_run(tmp_path, "older-moved", older))
    assert fields(found) == [("not_comparable", "runtime.packages.release")]


def test_the_locks_datasets_python_and_sglang_commit_are_fields(tmp_path):
    a = locked_run(tmp_path, "a", study_lock())
    datasets = {"HuggingFaceH4/mt_bench_prompts": {"requested": "main", "revision": "e" * 40}}
    git = {"sglang": {"ref": "refs/pull/29907/head", "commit": "9" * 40}}
    b = locked_run(tmp_path, "b", study_lock(python="3.12.4", datasets=datasets, git=git))
    found = check(a, b)
    assert fields(found) == [
        ("not_comparable", "datasets[HuggingFaceH4/mt_bench_prompts].revision"),
        ("not_comparable", "runtime.git.commit"),
        ("not_comparable", "runtime.python.git"),
        ("not_comparable", "runtime.python.release"),
    ]
    assert (found[0]["a"], found[0]["b"]) == ("d" * 40, "e" * 40)
    # The levels built the git runtime from c...c; the lock of B says 9...9: both shown.
    assert found[1]["b"] == ["9" * 40, "c" * 40]


def test_the_locks_driver_counts_only_where_no_level_records_one(tmp_path):
    a = locked_run(tmp_path, "a", study_lock())
    # Recorded where the runtime was frozen; the levels say where this run ran.
    assert check(a, locked_run(tmp_path, "b", study_lock(driver="590.10.01"))) == []
    unknown = {"driver_version": None, "cuda_version": None}
    a = locked_run(tmp_path, "a2", study_lock(), gpu_facts=unknown)
    b = locked_run(tmp_path, "b2", study_lock(driver="590.10.01"), gpu_facts=unknown)
    (found,) = check(a, b)
    # The module's rule for a driver: not comparable, whatever the hardware.
    assert (found["kind"], found["field"]) == ("not_comparable", "gpu.driver_version")
    assert (found["a"], found["b"]) == ("580.95.05", "590.10.01")
    # Each runtime's platform counts, the git one's too.
    lock = study_lock()
    lock["runtime"]["git"]["platform"]["driver"] = "590.10.01"
    (found,) = check(a, locked_run(tmp_path, "c2", lock, gpu_facts=unknown))
    assert (found["field"], found["b"]) == ("gpu.driver_version", ["580.95.05", "590.10.01"])


def test_a_changed_workload_is_one_warning_not_also_its_prompts_hash(tmp_path):
    common = {"prompt_sets": ("isl64-osl32",), "max_new_tokens": 32}
    a = run(tmp_path, "a", workloads={"isl64-osl32": WORKLOAD}, **common)
    other = {name: replace(sim, prompts_variant="seed-1") for name, sim in CONFIGS.items()}
    b = run(
        tmp_path, "b", configs=other, workloads={"isl64-osl32": {**WORKLOAD, "seed": 1}}, **common
    )
    (found,) = check(a, b)
    assert found["field"] == "prompts[isl64-osl32].workload"
    assert '"seed": 0' in found["message"] and '"seed": 1' in found["message"]


def test_a_workload_only_one_run_planned_is_no_difference(tmp_path):
    a = run(tmp_path, "a")
    b = run(tmp_path, "b")
    record = json.loads((b / "run.json").read_text())
    record["workloads"] = ["isl1024-osl1024"]  # planned in B, its levels only in B
    (b / "run.json").write_text(json.dumps(record))
    assert check(a, b) == []


# -- outside input -------------------------------------------------------------------------


HOSTILE = [
    ("settings", ["not", "a", "dict"]),
    ("settings", {"num_prompts": {"deep": [1, [2, {"x": None}]]}, "temperature": "hot"}),
    ("settings", {"max_new_tokens": "x" * 1_000_000}),
    ("provenance", None),
    ("provenance", {"gpu": "H200", "launch": "python", "runtime": 5, "weights": {"x": 1}}),
    (
        "provenance",
        {
            "gpu": {"models": [1, 2], "count": "eight", "driver_version": ["5"]},
            "launch": {"argv": [1, None, "--x", {"y": 2}, "z" * 100_000], "environment": ["A"]},
            "runtime": {"release": {"v": 1}, "git": "abc", "packages": "all"},
            "weights": [None, 3, {"repo_id": ["r"]}, {"repo_id": "r" * 5000, "revision": 7}],
            "prompts": "gsm8k",
            "chat_template_kwargs": [1, 2],
            "profile": {"p": 1},
        },
    ),
]


@pytest.mark.parametrize(("part", "value"), HOSTILE)
def test_wrong_types_are_compared_as_text_or_skipped_with_bounded_messages(tmp_path, part, value):
    a = run(tmp_path, "a")
    results_a, results_b = load(a), load(a)
    for level in results_b.levels[:1]:
        setattr(level, part, value)
    results_b.run["model"] = "not a model"
    results_b.run["lock"] = {
        "weights": ["x"],
        "datasets": {"d": "main"},
        "runtime": {
            "git": {"packages": [1]},
            "release": {
                "packages": {"t": {"version": ["x"] * 3, "sha256": 5}, "u": None, "v": {}},
                "python": {"v": "3" * 100_000},
                "platform": "x",
            },
        },
        "git": 3,
    }
    found = comparability.check(results_a, results_b)
    assert all(w["kind"] in comparability.KINDS for w in found)
    for warning in found:
        assert len(warning["message"]) <= comparability.MAX_MESSAGE
        assert len(json.dumps(warning)) < 20_000, warning["field"]
    assert len({w["field"] for w in found}) == len(found)  # one per field
    # The other way round, and the same run with itself, never fail either.
    assert len(comparability.check(results_b, results_a)) == len(found)
    assert comparability.check(results_b, results_b) == []


def test_a_huge_differing_value_is_compared_by_hash_and_shown_cut(tmp_path):
    a, b = load(run(tmp_path, "a")), load(run(tmp_path, "a2"))
    for level in a.levels:
        level.settings = {**level.settings, "telemetry": "x" * 100_000 + "1"}
    for level in b.levels:
        level.settings = {**level.settings, "telemetry": "x" * 100_000 + "2"}
    (found,) = comparability.check(a, b)
    assert found["field"] == "settings.telemetry"
    assert len(found["message"]) < 400 and len(found["a"]) <= MAX_SHOWN


def test_hostile_run_json_fields_do_not_stop_compare(tmp_path):
    a = run(tmp_path, "a")
    b = run(tmp_path, "b")
    record = json.loads((b / "run.json").read_text())
    record.update(workloads=5, telemetry={"a": [1]}, lock="yes", repeats=1)
    (b / "run.json").write_text(json.dumps(record))
    status, _stdout, found, _out = compared(tmp_path, a, b, "out", "--require-comparable")
    # run.json's telemetry counts only where no level records it; its workloads list is no setting.
    assert (status, found) == (0, [])


def test_accuracy_settings_are_compared_and_a_set_in_one_run_only_is_not(tmp_path):
    scored = {name: replace(sim, accuracy=0.9) for name, sim in CONFIGS.items()}
    common = {"configs": scored, "scored": {"gsm8k": "gsm8k"}}
    floors = {"gsm8k": {"floor": 0.8, "source": "model.yml"}}
    a = run(tmp_path, "a", prompt_sets=("gsm8k", "mt-bench"), accuracy_floors=floors, **common)
    b = run(
        tmp_path,
        "b",
        scored_kwargs={"thinking": True},
        accuracy_floors={"gsm8k": {"floor": 0.85, "source": "model.yml"}},
        **common,
    )
    found = check(a, b)
    assert fields(found) == [
        ("not_comparable", "prompts[gsm8k].chat_template_kwargs"),
        ("not_comparable", "model.accuracy_floors"),
    ]
    assert (found[0]["a"], found[0]["b"]) == ({"thinking": False}, {"thinking": True})


def test_when_the_models_differ_what_follows_from_them_is_expected(tmp_path):
    a = run(tmp_path, "a", launch_args=("--reasoning-parser", "kimi_k2"))
    b = run(tmp_path, "b", model=QWEN, launch_args=("--reasoning-parser", "qwen3"), num_prompts=8)
    found = check(a, b)
    assert fields(found) == [
        ("not_comparable", "settings.num_prompts"),
        ("expected_difference", "model"),
        ("expected_difference", "launch[ar,ddtree-b16].argv"),
    ]
    assert "expected, as the models differ" in found[2]["message"]
