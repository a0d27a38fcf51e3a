"""The study lock (module_utils/plan/study_lock.py): reading it as outside input, resolving,
recording, pins, and writers that meet."""

from __future__ import annotations

import multiprocessing
import subprocess

import pytest
import yaml
from ansible.module_utils.host.helpers import run_with_deadline
from ansible.module_utils.plan import study_lock as sl
from ansible.module_utils.plan import study_lock_file

A = "a" * 40
B = "b" * 40
C = "c" * 40
TARGET = "moonshotai/Kimi-K2.6"
MT = "HuggingFaceH4/mt_bench_prompts"
GIT = {"url": "https://github.com/sgl-project/sglang.git", "ref": "refs/pull/29907/head"}


def requested(target="main", mt="main", git=None):
    return {
        "weights": {TARGET: target},
        "datasets": {MT: mt},
        "git": {"sglang": git or GIT},
    }


class Resolvers:
    """Counting stand-ins for the hub and git: each call answers the next commit."""

    def __init__(self, commits=(A, B, C)):
        self.commits = dict(weights=commits[0], datasets=commits[1], git=commits[2])
        self.calls: list[tuple] = []

    def table(self):
        def make(section):
            def resolve(*args):
                self.calls.append((section, *args))
                return self.commits[section]

            return resolve

        return {section: make(section) for section in ("weights", "datasets", "git")}


def test_plan_resolves_everything_then_keeps_it(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    resolvers = Resolvers()
    first = sl.sync(path, requested(), resolvers=resolvers.table(), mode="resolve")
    assert first["written"] and first["exists"]
    assert first["pins"] == {
        "weights": {TARGET: A},
        "datasets": {MT: B},
        "git": {"sglang": {**GIT, "commit": C}},
    }
    text = (tmp_path / "kimi.lock.yml").read_text()
    assert text.startswith("# The study lock")
    data = yaml.safe_load(text)
    assert data["weights"][TARGET]["requested"] == "main"
    assert data["git"]["sglang"]["ref"] == GIT["ref"]
    # The hub's main moved on: a second plan keeps the lock's commits and asks nobody.
    moved = Resolvers(commits=(C, C, A))
    second = sl.sync(path, requested(), resolvers=moved.table(), mode="resolve")
    assert not second["written"] and moved.calls == []
    assert second["pins"]["weights"][TARGET] == A
    assert (tmp_path / "kimi.lock.yml").read_text() == text


def test_update_resolves_anew_and_drops_the_frozen_runtimes(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    sl.sync(path, requested(), resolvers=Resolvers().table(), mode="resolve")
    sl.record_runtime(path, "release", runtime_record())
    result = sl.sync(
        path, requested(), resolvers=Resolvers((C, C, A)).table(), mode="resolve", update=True
    )
    assert result["pins"]["weights"][TARGET] == C
    assert result["lock"]["runtime"] == {}
    assert f"weights {TARGET}: main -> {C} (was {A})" in result["messages"]


def test_a_changed_setting_is_relocked_by_plan_and_fails_a_deploy(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    sl.sync(path, requested(), resolvers=Resolvers().table(), mode="resolve")
    with pytest.raises(sl.LockError) as error:
        sl.sync(path, requested(target=C), mode="read")
    message = str(error.value)
    assert f"weights {TARGET}: the lock was made from main (commit {A}), this run asks" in message
    assert "plan.yml" in message and "kimi_lock_update=true" in message
    # The lock's own commit, asked by SHA, is the same study.
    assert sl.sync(path, requested(target=A), mode="read")["pins"]["weights"][TARGET] == A
    relocked = sl.sync(path, requested(target=C), resolvers=Resolvers().table(), mode="resolve")
    assert relocked["pins"]["weights"][TARGET] == C
    assert relocked["lock"]["weights"][TARGET]["requested"] == C


def test_another_git_source_does_not_fit_the_lock(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    sl.sync(path, requested(), resolvers=Resolvers().table(), mode="resolve")
    other = {"url": "https://example.invalid/fork.git", "ref": GIT["ref"]}
    with pytest.raises(sl.LockError, match="the lock has url"):
        sl.sync(path, requested(git=other), mode="read")
    # The ref given as the locked commit is the same source.
    pinned = sl.sync(path, requested(git={**GIT, "ref": C}), mode="read")
    assert pinned["pins"]["git"]["sglang"]["commit"] == C


def test_read_without_a_lock_pins_nothing_and_writes_nothing(tmp_path):
    path = tmp_path / "kimi.lock.yml"
    result = sl.sync(str(path), requested(), mode="read")
    assert not result["exists"] and not path.exists()
    assert result["pins"] == {"weights": {}, "datasets": {}, "git": {}}
    assert sorted(result["missing"]) == [f"datasets {MT}", "git sglang", f"weights {TARGET}"]


def test_a_run_records_only_what_it_resolved_and_the_lock_lacks(tmp_path):
    path = tmp_path / "kimi.lock.yml"
    nothing = sl.sync(str(path), requested(), known={}, mode="record")
    assert not nothing["written"] and not path.exists()
    first = sl.sync(str(path), requested(), known={"weights": {TARGET: A}}, mode="record")
    assert first["written"] and first["pins"]["weights"] == {TARGET: A}
    assert first["missing"] == [f"datasets {MT}", "git sglang"]
    # A later run's other commit for an entry the lock holds is no second opinion.
    later = sl.sync(
        str(path),
        requested(),
        known={"weights": {TARGET: B}, "git": {"sglang": C}},
        mode="record",
    )
    assert later["pins"]["weights"][TARGET] == A
    assert later["pins"]["git"]["sglang"]["commit"] == C


def test_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "kimi.lock.yml"
    result = sl.sync(
        str(path), requested(), resolvers=Resolvers().table(), mode="resolve", check_mode=True
    )
    assert result["written"] and not path.exists()


def test_an_unresolvable_entry_is_named_and_the_rest_is_locked(tmp_path):
    def no_git(url, ref):
        raise sl.LockError(f"git ref {ref} was not found at {url}")

    table = {**Resolvers().table(), "git": no_git}
    result = sl.sync(str(tmp_path / "kimi.lock.yml"), requested(), resolvers=table, mode="resolve")
    assert result["unresolved"] == [
        f"git sglang: git ref {GIT['ref']} was not found at {GIT['url']}"
    ]
    assert result["pins"]["weights"] == {TARGET: A} and result["missing"] == ["git sglang"]


def test_a_resolver_answer_that_is_no_commit_is_refused(tmp_path):
    table = {**Resolvers().table(), "weights": lambda repo, revision: "main"}
    with pytest.raises(sl.LockError, match="40-character commit"):
        sl.sync(str(tmp_path / "l.yml"), requested(), resolvers=table, mode="resolve")


def runtime_record(version="26.4", python="3.12.3"):
    return {
        "built_from": {"sglang": "0.5.23"},
        "python": python,
        "platform": {"driver": "580.65.06", "driver_cuda": "13.0"},
        "recorded_from": "node-a",
        "packages": {
            "packaging": {"version": version, "sha256": "1" * 64},
            "PyYAML": {"version": "6.0.4", "sha256": None},
        },
    }


def test_the_first_runtime_record_is_frozen_and_later_ones_compare(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    first = sl.record_runtime(path, "release", runtime_record())
    assert first["recorded"]
    held = first["runtime"]
    assert held["hashes"] == "partial"
    assert list(held["packages"]) == ["packaging", "pyyaml"]
    second = sl.record_runtime(path, "release", runtime_record(version="26.3"))
    assert not second["recorded"]
    assert second["runtime"]["packages"]["packaging"]["version"] == "26.4"
    other = {**runtime_record(version="26.3"), "built_from": {"sglang": "0.5.24"}}
    assert sl.record_runtime(path, "release", other, replace=True)["recorded"]
    assert study_lock_file.load(path)["runtime"]["release"]["built_from"] == {"sglang": "0.5.24"}


@pytest.mark.parametrize(
    "record, problem",
    [
        ({**runtime_record(), "packages": {}}, "packages is empty"),
        ({**runtime_record(), "built_from": {}}, "built_from is empty"),
        (
            {**runtime_record(), "packages": {"x": {"version": "1", "sha256": "zz"}}},
            "64-character sha256",
        ),
        ({**runtime_record(), "packages": {"../x": {"version": "1"}}}, "PEP 503"),
        ({**runtime_record(), "python": 3.12}, "needed a string"),
    ],
)
def test_a_bad_runtime_record_is_refused(tmp_path, record, problem):
    with pytest.raises(sl.LockError, match=problem):
        sl.record_runtime(str(tmp_path / "l.yml"), "release", record)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"lock_version: 1\nweights: [1, 2]\n", "weights is list"),
        (b"lock_version: 2\n", "this kit reads 1"),
        (b"- a\n", "not a mapping"),
        (b"lock_version: 1\nweights: {'../x': {requested: main, revision: x}}\n", "owner/name"),
        (
            b"lock_version: 1\nweights: {'o/n': {requested: main, revision: 'main'}}\n",
            "40-character commit",
        ),
        (
            b"lock_version: 1\ngit: {sglang: {url: '--upload-pack=x', ref: r, commit: '"
            + A.encode()
            + b"'}}\n",
            "begins with '-'",
        ),
        (b"lock_version: 1\nsurprise: 1\n", "does not know: surprise"),
        (b"lock_version: 1\nruntime: {conda: {}}\n", "one of release, git"),
        (b"{unclosed", "is not a study lock's YAML"),
        (b"\xff\xfe", "is not a study lock's YAML"),
    ],
)
def test_a_bad_lock_file_fails_naming_the_entry_and_the_fix(tmp_path, content, problem):
    path = tmp_path / "kimi.lock.yml"
    path.write_bytes(content)
    with pytest.raises(sl.LockError) as error:
        sl.sync(str(path), requested(), mode="read")
    assert problem in str(error.value)
    assert str(path) in str(error.value)


def test_a_hostile_lock_fails_at_once_naming_the_file(tmp_path):
    """Hardening II (5): a 1.7 KB lock whose aliases expand to 64^4 items took 544 s and 831 MB
    through the lock tasks that start every playbook; 40 KB of nested brackets raised an
    uncaught RecursionError. Both fail as the file's YAML, naming the file (at once: the loader
    stops at the first alias or the 17th level)."""
    bomb = ["lock_version: 1", "a: &a [" + ", ".join(["x"] * 64) + "]"]
    for name, below in (("b", "a"), ("c", "b"), ("d", "c")):
        bomb.append(f"{name}: &{name} [" + ", ".join([f"*{below}"] * 64) + "]")
    bomb.append("runtime: {release: {built_from: *d}}")
    for content, problem in (
        ("\n".join(bomb) + "\n", "an alias (*name), which a study lock never holds"),
        ("lock_version: 1\nruntime: " + "[" * 20000 + "]" * 20000 + "\n", "nested deeper than"),
    ):
        path = tmp_path / "kimi.lock.yml"
        path.write_text(content)
        with pytest.raises(sl.LockError) as error:
            sl.sync(str(path), requested(), mode="read")
        assert problem in str(error.value) and str(path) in str(error.value)
        assert "kimi_lock_update=true" in str(error.value)


def test_a_huge_lock_file_is_not_read(tmp_path):
    path = tmp_path / "kimi.lock.yml"
    path.write_bytes(b"#" * (study_lock_file.MAX_LOCK_BYTES + 1))
    with pytest.raises(sl.LockError, match="larger than"):
        study_lock_file.load(str(path))


def test_two_hosts_asking_one_repository_at_two_revisions_fail():
    with pytest.raises(sl.LockError, match="different revisions"):
        sl.merge_requested([requested(), requested(target=A)])
    assert sl.merge_requested([requested(), requested()]) == requested()


def test_known_commits_merge_with_the_first_host_standing():
    merged = sl.merge_known(
        [{"weights": {TARGET: A}}, {"weights": {TARGET: B}, "git": {"sglang": "not a sha"}}]
    )
    assert merged == {"weights": {TARGET: A}, "datasets": {}, "git": {}}


def _record_in_process(path: str, repo: str, commit: str) -> None:
    sl.sync(path, {"weights": {repo: "main"}}, known={"weights": {repo: commit}}, mode="record")


def test_writers_that_meet_lose_no_entry(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    repos = [(f"org/model-{i}", f"{i:040x}") for i in range(12)]
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_record_in_process, args=(path, repo, commit))
        for repo, commit in repos
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [writer.exitcode for writer in writers] == [0] * len(repos)
    lock = study_lock_file.load(path)
    assert {repo: entry["revision"] for repo, entry in lock["weights"].items()} == dict(repos)


@pytest.mark.parametrize(
    "output, ref, commit",
    [
        (f"{A}\trefs/pull/29907/head\n", "refs/pull/29907/head", A),
        (f"{A}\trefs/heads/main\n{B}\trefs/remotes/x/main\n", "main", A),
        (f"{A}\trefs/tags/v1\n{B}\trefs/tags/v1^{{}}\n", "v1", B),
    ],
)
def test_ls_remote_answers_name_the_ref_commit(output, ref, commit):
    assert sl.ls_remote_commit(output, "u", ref) == commit


def test_ls_remote_without_the_ref_or_with_two_fails():
    with pytest.raises(sl.LockError, match="was not found"):
        sl.ls_remote_commit("", "u", "nope")
    with pytest.raises(sl.LockError, match="ambiguous"):
        sl.ls_remote_commit(f"{A}\trefs/heads/x/v1\n{B}\trefs/tags/y/v1\n", "u", "v1")


def test_git_resolver_reads_a_real_repository(tmp_path):
    def git(*args):
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q", "-b", "main")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    head = git("rev-parse", "HEAD")
    git("update-ref", "refs/pull/7/head", head)
    resolve = sl.git_resolver(run_with_deadline, 30)
    assert resolve(f"file://{tmp_path}", "refs/pull/7/head") == head
    assert resolve(f"file://{tmp_path}", head) == head
    with pytest.raises(sl.LockError, match="was not found"):
        resolve(f"file://{tmp_path}", "refs/pull/8/head")
    with pytest.raises(sl.LockError, match="failed"):
        resolve(f"file://{tmp_path}/missing", "main")


def test_a_plan_without_the_hub_names_what_does_not_fit_and_pins_the_rest(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    sl.sync(path, requested(), resolvers=Resolvers().table(), mode="resolve")
    result = sl.sync(path, requested(target=C), mode="read", tolerate_mismatch=True)
    assert result["pins"]["weights"] == {} and result["pins"]["datasets"] == {MT: B}
    assert result["unresolved"][0].startswith(f"weights {TARGET}: the lock was made from main")


def test_a_frozen_set_whose_source_moved_is_dropped_by_plan(tmp_path):
    path = str(tmp_path / "kimi.lock.yml")
    sl.sync(path, requested(), resolvers=Resolvers().table(), mode="resolve")
    sl.record_runtime(path, "release", runtime_record())
    git_record = {**runtime_record(), "built_from": {"commit": C, "patches": []}}
    sl.record_runtime(path, "git", git_record)
    same = sl.sync(
        path, requested(), mode="resolve", runtime_built_from={"release": {"sglang": "0.5.23"}}
    )
    assert set(same["lock"]["runtime"]) == {"release", "git"} and not same["written"]
    newer = sl.sync(
        path, requested(), mode="resolve", runtime_built_from={"release": {"sglang": "0.5.24"}}
    )
    assert set(newer["lock"]["runtime"]) == {"git"}
    # Another ref relocks the git commit, and the git set built from the old one goes.
    moved = {**GIT, "ref": "refs/pull/30000/head"}
    relocked = sl.sync(
        path, requested(git=moved), resolvers=Resolvers((A, B, A)).table(), mode="resolve"
    )
    assert relocked["lock"]["runtime"] == {}
    assert relocked["pins"]["git"]["sglang"]["commit"] == A


def test_a_git_url_with_credentials_never_reaches_the_lock(tmp_path):
    secret = {"url": "https://user:hf_secret@example.invalid/sglang.git", "ref": "main"}
    with pytest.raises(sl.LockError, match="carries credentials"):
        sl.merge_requested([requested(git=secret)])
    path = tmp_path / "kimi.lock.yml"
    path.write_text(
        "lock_version: 1\ngit: {sglang: {url: 'https://u:p@h/x.git', ref: r, commit: '"
        + A
        + "'}}\n"
    )
    with pytest.raises(sl.LockError, match="carries credentials") as error:
        study_lock_file.load(str(path))
    assert "u:p" not in str(error.value)


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("version", "2.0 --index-url=http://evil", "package version"),
        ("version", "1.0\n", "package version"),
        ("python", "3.12.3\n--x", "Python version"),
    ],
)
def test_runtime_values_that_could_reach_a_requirements_line_are_refused(
    tmp_path, field, value, problem
):
    record = runtime_record()
    if field == "version":
        record["packages"]["packaging"]["version"] = value
    else:
        record[field] = value
    with pytest.raises(sl.LockError, match=problem):
        sl.record_runtime(str(tmp_path / "l.yml"), "release", record)


def test_two_spellings_of_one_package_are_refused(tmp_path):
    record = runtime_record()
    record["packages"]["Foo_Bar"] = {"version": "1"}
    record["packages"]["foo-bar"] = {"version": "2"}
    with pytest.raises(sl.LockError, match="lists foo-bar twice"):
        sl.record_runtime(str(tmp_path / "l.yml"), "release", record)


def test_a_lock_held_too_long_or_an_unwritable_folder_fails_with_the_fix(tmp_path):
    import fcntl
    import os

    path = str(tmp_path / "kimi.lock.yml")
    holder = os.open(str(tmp_path / ".kimi.lock.yml.flock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with (
            pytest.raises(sl.LockError, match="another run has held"),
            study_lock_file.locked_folder(path, wait_s=0.5),
        ):
            pass
    finally:
        os.close(holder)
    with pytest.raises(sl.LockError, match="cannot be written"):
        sl.record_runtime("/proc/kimi/kimi.lock.yml", "release", runtime_record())


def test_hosts_that_resolved_a_branch_to_two_commits_are_named():
    conflicts: list[str] = []
    merged = sl.merge_known([{"weights": {TARGET: A}}, {"weights": {TARGET: B}}], conflicts)
    assert merged["weights"] == {TARGET: A}
    assert conflicts == [
        f"weights {TARGET}: host 2 of the run used {B}, an earlier one {A} (it moved during "
        f"the run); the lock keeps {A}"
    ]
