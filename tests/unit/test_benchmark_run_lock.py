"""run.json's `lock`: the study lock the benchmark used (the fact kimi_study_lock that
playbooks/lock.yml sets), rendered with Ansible's own templating from the role's run record in
roles/benchmark/tasks/main.yml, then written as the role writes run.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from tests.support.modules import add_filter_plugins

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "roles" / "benchmark" / "tasks" / "main.yml"
LOCK_PATH = "/srv/kit/kimi.lock.yml"
SHA = "0123456789abcdef0123456789abcdef01234567"
TORCH_SHA256 = "ab" * 32
KEPT = {"built_from", "python", "platform", "hashes", "packages"}


def runtime(built_from: dict, packages: dict) -> dict:
    return {
        "built_from": built_from,
        "python": "3.12.3",
        "platform": {"driver": "580.65.06", "driver_cuda": "13.0"},
        "recorded_from": "gpu-a",
        "recorded_at": "2026-12-01T14:05:00Z",
        "hashes": "partial",
        "packages": packages,
    }


# What study_lock's `ensure` returns (LOCK.md), as the play sets it.
STUDY_LOCK = {
    "path": LOCK_PATH,
    "exists": True,
    "written": False,
    "lock": {
        "lock_version": 1,
        "written_at": "2026-12-01T14:00:00Z",
        "weights": {
            "moonshotai/Kimi-K2.6": {
                "requested": "main",
                "revision": SHA,
                "resolved_at": "2026-12-01T14:00:00Z",
            }
        },
        "datasets": {
            "HuggingFaceH4/mt_bench_prompts": {
                "requested": "main",
                "revision": SHA[::-1],
                "resolved_at": "2026-12-01T14:00:00Z",
            }
        },
        "git": {
            "sglang": {
                "url": "https://github.com/sgl-project/sglang.git",
                "ref": "refs/pull/29907/head",
                "commit": SHA,
                "resolved_at": "2026-12-01T14:00:00Z",
            }
        },
        "runtime": {
            "release": runtime(
                {"sglang": "0.5.23"},
                {
                    "torch": {"version": "2.14.1", "sha256": TORCH_SHA256},
                    "sgl-kernel": {"version": "0.4.1", "sha256": None},
                },
            ),
            "git": runtime(
                {"commit": SHA, "patches": [{"name": "fix.patch", "sha256": TORCH_SHA256}]},
                {"torch": {"version": "2.14.1", "sha256": TORCH_SHA256}},
            ),
        },
    },
    "pins": {"weights": {"moonshotai/Kimi-K2.6": SHA}},
    "resolved": [],
    "messages": ["the study lock /srv/kit/kimi.lock.yml pins 4 references"],
}


def trusted(value):
    """The role's own YAML, trusted as templates, as ansible-playbook trusts it."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value


def run_records() -> list[dict]:
    """The run record of each task that writes run.json (both share one YAML anchor)."""
    tasks = yaml.safe_load(TASKS.read_text())
    found = []

    def walk(items):
        for task in items:
            walk(task.get("block", []))
            record = task.get("vars", {}).get("__benchmark_run_record")
            if record is not None:
                found.append(record)

    walk(tasks)
    return found


def written_lock(variables: dict):
    """run.json's `lock` as the role writes it: the record's template rendered, then the
    record through to_nice_json, read back."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    add_filter_plugins()
    record = {"lock": run_records()[0]["lock"]}
    templar = Templar(
        loader=DataLoader(), variables={**variables, "__benchmark_run_record": trusted(record)}
    )
    text = templar.template(
        trust_as_template("{{ __benchmark_run_record | to_nice_json(sort_keys=true) }}\n")
    )
    return json.loads(text)["lock"]


def test_both_run_json_writes_carry_the_lock():
    records = run_records()
    assert len(records) == 2
    assert records[0]["lock"] == records[1]["lock"]


def test_the_lock_is_the_files_content_and_path_with_each_runtimes_own_fields():
    lock = written_lock({"kimi_study_lock": STUDY_LOCK})
    content = STUDY_LOCK["lock"]
    assert set(lock) == {"file", "weights", "datasets", "git", "runtime"}
    assert lock["file"] == LOCK_PATH
    for section in ("weights", "datasets", "git"):
        assert lock[section] == content[section], section
    assert set(lock["runtime"]) == {"release", "git"}
    for kind, entry in content["runtime"].items():
        assert lock["runtime"][kind] == {k: v for k, v in entry.items() if k in KEPT}, kind
    # Who recorded the runtime and when says nothing about what ran.
    assert "recorded_from" not in lock["runtime"]["release"]
    assert lock["runtime"]["release"]["packages"]["sgl-kernel"] == {
        "version": "0.4.1",
        "sha256": None,
    }


def test_a_lock_without_runtimes_or_datasets_keeps_them_empty():
    study = copy.deepcopy(STUDY_LOCK)
    del study["lock"]["runtime"], study["lock"]["datasets"]
    lock = written_lock({"kimi_study_lock": study})
    assert lock["runtime"] == {} and lock["datasets"] == {}
    assert lock["weights"] == STUDY_LOCK["lock"]["weights"]


def test_without_a_lock_play_the_lock_is_null():
    assert written_lock({}) is None
    assert written_lock({"kimi_study_lock": {}}) is None
