"""The kit's filter plugins (filter_plugins/kimi_filters.py): what several roles work out alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from tests.support.models import definitions
from tests.support.modules import load_filters

REPO = Path(__file__).resolve().parents[2]


filters = load_filters()
# K2.6's serving configs, as group_vars/all derives them from models/kimi-k2.6/model.yml.
DEFINITIONS = definitions()


@pytest.mark.parametrize(
    ("selected", "needed"),
    [
        (["ar"], ["target"]),
        (["ar", "eagle3", "dflash", "ddtree"], ["target", "eagle3", "dflash"]),
        (["ddtree", "dflash"], ["target", "dflash"]),
        (["dflash-tree-backend"], ["target", "dflash"]),
        ([], ["target"]),
    ],
)
def test_needed_repos_are_the_target_then_each_drafter_once(selected, needed):
    assert filters.kimi_needed_repos(selected, DEFINITIONS) == needed


def test_needed_repos_name_an_unknown_config_and_the_defined_ones():
    with pytest.raises(AnsibleFilterError, match=r"\['dflsh'\] are not defined.*'dflash'"):
        filters.kimi_needed_repos(["ar", "dflsh"], DEFINITIONS)
    with pytest.raises(AnsibleFilterError, match="list of config names"):
        filters.kimi_needed_repos("dflash", DEFINITIONS)


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("127.0.0.1", 30000, "http://127.0.0.1:30000"),
        ("0.0.0.0", 30000, "http://127.0.0.1:30000"),  # noqa: S104 - a setting, not bound
        ("::", "30000", "http://127.0.0.1:30000"),
        ("", 8080, "http://127.0.0.1:8080"),
        ("10.1.2.17", 30000, "http://10.1.2.17:30000"),
        ("fd00::17", 30000, "http://[fd00::17]:30000"),
        ("gpu-node-17.lab", 30000, "http://gpu-node-17.lab:30000"),
    ],
)
def test_server_url_is_what_the_servers_own_host_connects_to(host, port, url):
    assert filters.kimi_server_url({"host": host, "port": port}) == url


@pytest.mark.parametrize(
    "settings",
    [
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 70000},
        {"host": "127.0.0.1", "port": "http"},
        {"host": "127.0.0.1"},
        {"host": "a b", "port": 1},
        {"host": "evil/path?x=", "port": 1},
        "127.0.0.1:30000",
    ],
)
def test_server_url_refuses_what_is_no_host_and_port(settings):
    with pytest.raises(AnsibleFilterError):
        filters.kimi_server_url(settings)


def test_the_filters_are_registered_under_their_names():
    assert {"kimi_needed_repos", "kimi_server_url", "kimi_speed_plan"} <= set(
        filters.FilterModule().filters()
    )


def test_model_data_is_read_again_when_the_file_changes(tmp_path):
    """The filter keeps a model's checked data between the many times group_vars template it,
    but never a stale copy: a changed model.yml is read and checked again, and a caller that
    changes what it got does not change what the next one gets."""
    import shutil

    shutil.copytree(Path(__file__).resolve().parents[2] / "models" / "kimi-k2.6", tmp_path / "m")
    (tmp_path / "m" / "model.yml").write_text(
        (tmp_path / "m" / "model.yml").read_text().replace("name: kimi-k2.6", "name: m")
    )
    data = filters.kimi_model_data("m", tmp_path)
    assert data["tp_size"] == 8
    data["tp_size"] = 99
    assert filters.kimi_model_data("m", tmp_path)["tp_size"] == 8
    path = tmp_path / "m" / "model.yml"
    path.write_text(path.read_text().replace("tp_size: 8", "tp_size: 4"))
    assert filters.kimi_model_data("m", tmp_path)["tp_size"] == 4
    path.write_text(path.read_text().replace("tp_size: 4", "tp_size: '4'"))
    with pytest.raises(AnsibleFilterError, match="tp_size is '4'"):
        filters.kimi_model_data("m", tmp_path)


REPOS = {
    "target": {"repo_id": "moonshotai/Kimi-K2.6", "revision": "main"},
    "dflash": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": "main"},
    "eagle3": {"repo_id": "lightseekorg/kimi-k2.6-eagle3.1-mla", "revision": "main"},
}
SETS = {
    "gsm8k": {"repo": "openai/gsm8k", "revision": "e" * 40, "file": "f"},
    "mt-bench": {"repo": "HuggingFaceH4/mt_bench_prompts", "revision": "main", "file": "f"},
}
GIT = {"url": "file:///srv/git/sglang.git", "ref": "refs/pull/29907/head", "patches": []}


def test_the_study_lock_is_asked_for_what_the_configs_and_sets_need():
    asked = filters.kimi_study_requested(
        REPOS, ["ar", "dflash"], DEFINITIONS, ["mt-bench"], SETS, GIT
    )
    assert asked == {
        "weights": {"moonshotai/Kimi-K2.6": "main", "z-lab/Kimi-K2.6-DFlash": "main"},
        "datasets": {"HuggingFaceH4/mt_bench_prompts": "main"},
        # No config runs on the git runtime: its source is not asked for.
        "git": {},
    }
    with_tree = filters.kimi_study_requested(
        REPOS, ["ddtree-b32"], DEFINITIONS, ["gsm8k", "own-file"], SETS, GIT
    )
    assert with_tree["git"] == {"sglang": {"url": GIT["url"], "ref": GIT["ref"]}}
    assert with_tree["datasets"] == {"openai/gsm8k": "e" * 40}


def test_two_prompt_sets_asking_one_dataset_at_two_revisions_fail():
    sets = {**SETS, "gsm8k-main": {**SETS["gsm8k"], "revision": "main"}}
    with pytest.raises(AnsibleFilterError, match="gsm8k and gsm8k-main ask openai/gsm8k"):
        filters.kimi_study_requested(REPOS, ["ar"], DEFINITIONS, ["gsm8k", "gsm8k-main"], sets, GIT)


def test_the_lock_pins_replace_what_was_asked_for_and_nothing_else():
    lock = {
        "lock": {
            "weights": {"moonshotai/Kimi-K2.6": {"requested": "main", "revision": "a" * 40}},
            "datasets": {
                "HuggingFaceH4/mt_bench_prompts": {"requested": "main", "revision": "b" * 40}
            },
        },
        "pins": {
            "weights": {"moonshotai/Kimi-K2.6": "a" * 40},
            "datasets": {"HuggingFaceH4/mt_bench_prompts": "b" * 40},
            "git": {"sglang": {"url": GIT["url"], "ref": GIT["ref"], "commit": "c" * 40}},
        },
    }
    repos = filters.kimi_lock_pinned(REPOS, lock, "repos")
    assert repos["target"]["revision"] == "a" * 40 and repos["dflash"]["revision"] == "main"
    sets = filters.kimi_lock_pinned(SETS, lock, "prompt_sets")
    assert sets["mt-bench"]["revision"] == "b" * 40 and sets["gsm8k"] == SETS["gsm8k"]
    assert filters.kimi_lock_pinned(GIT, lock, "git")["commit"] == "c" * 40
    # Another source than the lock's keeps no commit of it; no lock changes nothing.
    assert "commit" not in filters.kimi_lock_pinned({**GIT, "url": "x"}, lock, "git")
    assert filters.kimi_lock_pinned(REPOS, {}, "repos") == REPOS
    with pytest.raises(AnsibleFilterError, match="one of repos"):
        filters.kimi_lock_pinned(REPOS, lock, "weights")
    # A set asking another revision of a locked repository keeps its own.
    other = {"mt-pinned": {**SETS["mt-bench"], "revision": "c" * 40}}
    assert filters.kimi_lock_pinned(other, lock, "prompt_sets") == other


def test_what_a_run_used_comes_from_its_stages_facts():
    used = filters.kimi_study_used(
        REPOS,
        {"target": "a" * 40},
        {"source": {"url": GIT["url"], "ref": GIT["ref"], "commit": "c" * 40}},
        {
            "sets": {
                "mt-bench": {"source": {"repo": SETS["mt-bench"]["repo"], "resolved": "b" * 40}},
                "own": {"source": "questions.jsonl"},
            }
        },
    )
    assert used == {
        "weights": {"moonshotai/Kimi-K2.6": "a" * 40},
        "datasets": {"HuggingFaceH4/mt_bench_prompts": "b" * 40},
        "git": {"sglang": "c" * 40},
    }
    assert filters.kimi_study_used(REPOS, {}, {}, {}) == {"weights": {}, "datasets": {}, "git": {}}


@pytest.mark.parametrize(
    ("address", "example"),
    [
        ("192.0.2.10", True),
        ("198.51.100.7", True),
        ("203.0.113.255", True),
        ("[2001:db8::1]", True),
        ("gpu1.example.com", True),
        ("node.example", True),
        (("10.0.0.5", "ct200-node-01"), False),
        (("", "192.0.2.3"), True),
        ("10.1.2.3", False),
        ("192.0.3.1", False),
        ("gpu1.lab.internal", False),
        ("examples.org", False),
        (None, False),
    ],
)
def test_documentation_addresses_are_told_from_real_ones(address, example):
    assert filters.kimi_example_address(address) is example


# kimi_speed_plan's inputs as the plan role gives them (roles/plan/tasks/main.yml).
K26 = REPO / "models" / "kimi-k2.6"
SPEED_CONFIGS = {
    "target": str(K26 / "config.json"),
    "dflash": str(K26 / "dflash" / "config.json"),
    "eagle3": str(K26 / "eagle3" / "config.json"),
}
SPEED_LAUNCHES = [
    {"name": "ar", "base": "ar", "tp_size": 8,
     "argv": ["python", "-m", "sglang.launch_server", "--tp-size", "8"]},
    {"name": "ddtree-b32", "base": "ddtree", "tp_size": 8, "budget": 32,
     "argv": ["python", "-m", "sglang.launch_server", "--tp-size", "8",
              "--speculative-algorithm", "DDTREE", "--speculative-num-draft-tokens", "8",
              "--speculative-ddtree-budget", "32", "--disable-overlap-schedule"]},
]  # fmt: skip


def speed_hardware() -> dict:
    import json

    path = REPO / "group_vars" / "all" / "speed_hardware.json"
    return json.loads(path.read_text())["kimi_speed_hardware"]


def speed_plan_of(calibration_file, profile="h200", capacities=None, hardware=None):
    return filters.kimi_speed_plan(
        SPEED_LAUNCHES,
        capacities or {},
        SPEED_CONFIGS,
        str(K26),
        hardware or speed_hardware(),
        profile,
        [1, 16],
        ["gsm8k", "mt-bench"],
        456,
        calibration_file=str(calibration_file),
        allreduce_note="nominal: the record stays on the host",
        sources={"context_tokens": "the test's"},
    )


def test_the_speed_plan_filter_predicts_each_launch_and_ddtree_s_best_budget(tmp_path):
    speed = speed_plan_of(tmp_path / "absent.json", capacities={"ar": 8, "ddtree-b32": None})
    assert speed["calibration"] is None and speed["profile"] == "h200"
    assert speed["sources"]["allreduce"] == "nominal: the record stays on the host"
    assert speed["sources"]["context_tokens"] == "the test's"
    ar = speed["launches"]["ar"]
    # The capacity plan's cap of 8: 16 clients, 8 running.
    assert ar["max_running_requests"] == 8 and ar["levels"][1]["batch"] == 8
    tree = speed["ddtree"]["ddtree"]
    assert tree["budgets"] == [32] and tree["launches"] == ["ddtree-b32"]
    assert {curve["concurrency"] for curve in tree["curves"]} == {1, 16}
    assert all(isinstance(curve["best_budget"], int) for curve in tree["curves"])


def test_the_speed_plan_filter_uses_the_host_s_calibration_and_fails_on_a_bad_one(tmp_path):
    import json

    record = tmp_path / "speed-calibration.json"
    rows = [{"tokens": 1, "experts_touched": 8.0, "ms": 0.08},
            {"tokens": 65, "experts_touched": 280.0, "ms": 1.16}]  # fmt: skip
    record.write_text(
        json.dumps(
            {"schema": 1, "kind": "kimi-speed-calibration", "measured_at": "2026-12-02T00:00:00Z",
             "gpu": {"name": "NVIDIA H200"}, "copy_gbs": 4100.0,
             "moe": {"hidden": 7168, "intermediate": 256, "weight_bytes": 2, "rows": rows}}
        )
    )  # fmt: skip
    speed = speed_plan_of(record)
    assert speed["calibration"] == f"this host's calibration record {record}"
    assert speed["figures"]["copy_gbs"] == 4100.0
    record.write_text('{"schema": 1, "kind": "kimi-speed-calibration"}')
    with pytest.raises(AnsibleFilterError) as raised:
        speed_plan_of(record)
    assert str(raised.value).startswith(f"kimi_speed_plan: this host's calibration record {record}")
    assert "remove the file" in str(raised.value)
    record.write_text("not json")
    with pytest.raises(AnsibleFilterError, match="is not JSON"):
        speed_plan_of(record)


def test_the_speed_plan_filter_fails_on_bad_hardware_data_with_the_fix(tmp_path):
    with pytest.raises(AnsibleFilterError, match="'a100' is not known; needed: one of b200"):
        speed_plan_of(tmp_path / "absent.json", profile="a100")
    broken = speed_hardware()
    broken["h200"]["hbm_gbs"] = {"value": 0, "source": "typo"}
    with pytest.raises(AnsibleFilterError, match=r"h200\.hbm_gbs is 0; needed: above 0"):
        speed_plan_of(tmp_path / "absent.json", hardware=broken)
    with pytest.raises(AnsibleFilterError, match="needs serving_render's launches"):
        filters.kimi_speed_plan("ar", {}, SPEED_CONFIGS, str(K26), speed_hardware(), "h200",
                                [1], [], 456)  # fmt: skip


def test_the_weights_folders_are_one_server_files_run_a_gated_one_for_the_service_group():
    hub = {
        "repos": {
            "target": {"repo_id": "moonshotai/Kimi-K2.6", "gated": False},
            "dflash": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "gated": True},
            "eagle3": {"repo_id": "not/needed", "gated": True},
        }
    }
    folders = filters.kimi_weights_folders(
        hub, ["target", "dflash"], "/opt/w", "/opt/w/.kimi", "kimi"
    )
    assert folders == [
        {"path": "/opt/w", "state": "directory", "mode": "0755"},
        {"path": "/opt/w/.kimi", "state": "directory", "mode": "0755"},
        {
            "path": "/opt/w/moonshotai/Kimi-K2.6",
            "state": "directory",
            "mode": "0755",
            "owner": "root",
            "group": "root",
        },
        {
            "path": "/opt/w/z-lab/Kimi-K2.6-DFlash",
            "state": "directory",
            "mode": "0750",
            "owner": "root",
            "group": "kimi",
        },
        {"path": "/opt/w/.kimi/moonshotai--Kimi-K2.6", "state": "directory", "mode": "0755"},
        {"path": "/opt/w/.kimi/z-lab--Kimi-K2.6-DFlash", "state": "directory", "mode": "0755"},
    ]
    for bad in ({"repos": {"target": {"gated": False}}}, {"repos": []}, "hub"):
        with pytest.raises(AnsibleFilterError, match="kimi_weights_folders"):
            filters.kimi_weights_folders(bad, ["target"], "/opt/w", "/opt/w/.kimi", "kimi")
