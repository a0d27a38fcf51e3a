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
    assert {"kimi_needed_repos", "kimi_server_url"} <= set(filters.FilterModule().filters())


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
