"""Versioned runtimes (module_utils/runtime/versions.py, library/runtime_version.py): ids,
the atomic switch of the link, the bounded history, pruning, rollback targets, the migration of
a venv deployed before versions, and versions.json read as untrusted input."""

from __future__ import annotations

import json
import os
import threading

import pytest
from ansible.module_utils.runtime import versions as rv

from tests.support.modules import assert_unchanged, run_module

INPUTS_A = {"built_from": {"sglang": "0.5.23"}, "python": "3.11.2", "machine": "x86_64"}
INPUTS_B = {**INPUTS_A, "built_from": {"sglang": "0.5.24"}}


@pytest.fixture
def host(tmp_path):
    """A host's layout: the link path, the versions folder and the state folder."""
    layout = {
        "link": str(tmp_path / "venv"),
        "versions_dir": str(tmp_path / "runtimes"),
        "state_dir": str(tmp_path / "state"),
    }
    os.makedirs(layout["versions_dir"])
    os.makedirs(layout["state_dir"])
    return layout


def build(host, name: str) -> str:
    """A version folder with a bin/python, as the runtime stage leaves a built one."""
    folder = os.path.join(host["versions_dir"], name)
    os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
    with open(os.path.join(folder, "bin", "python"), "w") as handle:
        handle.write(name)
    return folder


def name(inputs, kind="release") -> str:
    return f"{kind}-{rv.version_id(kind, inputs)}"


def switch(host, target, keep=2, **kwargs):
    return rv.switch(
        host["link"], host["versions_dir"], host["state_dir"], "release", target, keep, **kwargs
    )


def history_names(host, kind="release") -> list[str]:
    return [e["name"] for e in rv.read_history(host["state_dir"])["kinds"][kind]]


def test_ids_are_stable_and_distinct():
    assert rv.version_id("release", INPUTS_A) == rv.version_id("release", dict(INPUTS_A))
    # Key order does not matter; every input does.
    assert rv.version_id("release", dict(reversed(list(INPUTS_A.items())))) == rv.version_id(
        "release", INPUTS_A
    )
    ids = {
        rv.version_id("release", INPUTS_A),
        rv.version_id("release", INPUTS_B),
        rv.version_id("git", INPUTS_A),
        rv.version_id("release", {**INPUTS_A, "pip_args": ["--no-index"]}),
        rv.version_id("release", {**INPUTS_A, "python": "3.12.1"}),
        rv.version_id("release", {**INPUTS_A, "machine": "aarch64"}),
    }
    assert len(ids) == 6
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)
    with pytest.raises(rv.VersionError, match="none of release, git"):
        rv.version_id("../x", INPUTS_A)


def test_switch_points_the_link_atomically_and_a_second_switch_changes_nothing(host):
    a, b = name(INPUTS_A), name(INPUTS_B)
    folder_a, folder_b = build(host, a), build(host, b)
    first = switch(host, a, at="t1")
    assert first["changed"] and first["previous"] is None
    assert os.path.islink(host["link"]) and os.path.realpath(host["link"]) == folder_a
    assert switch(host, a, at="t2")["changed"] is False
    assert history_names(host) == [a]
    # While the link moves to b, a reader always finds one python or the other, never none.
    seen, stop, errors = set(), threading.Event(), []

    def read():
        while not stop.is_set():
            try:
                with open(os.path.join(host["link"], "bin", "python")) as handle:
                    seen.add(handle.read())
            except OSError as error:
                errors.append(error)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for turn in range(200):
            switch(host, b if turn % 2 == 0 else a, keep=5, at=f"t{turn}")
    finally:
        stop.set()
        reader.join()
    assert not errors, errors
    assert seen <= {a, b} and a in seen
    switched = switch(host, b, at="t9")
    assert switched["changed"] and switched["previous"] == a
    assert os.path.realpath(host["link"]) == folder_b
    assert not [f for f in os.listdir(os.path.dirname(host["link"])) if "kimi-switch" in f]


def test_switch_refuses_a_version_not_built_and_names_outside_the_folder(host):
    with pytest.raises(rv.VersionError, match="holds no built runtime"):
        switch(host, name(INPUTS_A))
    for bad in ("../release-0123456789ab", "release-../../etc", "release-0123456789ab/..", "git"):
        with pytest.raises(rv.VersionError, match="is not a runtime version"):
            switch(host, bad)
    with pytest.raises(rv.VersionError, match="not a version of the release runtime"):
        switch(host, "git-0123456789ab")
    # A version folder that is itself a link out of the versions folder is refused.
    outside = os.path.join(os.path.dirname(host["versions_dir"]), "elsewhere")
    os.makedirs(os.path.join(outside, "bin"))
    os.symlink(outside, os.path.join(host["versions_dir"], "release-0123456789ab"))
    with pytest.raises(rv.VersionError, match="leads outside"):
        switch(host, "release-0123456789ab")
    with pytest.raises(rv.VersionError, match="is not a runtime version under"):
        rv.name_of(host["versions_dir"], os.path.join(host["versions_dir"], "..", "x"))


def test_history_is_bounded(host):
    a, b = build(host, name(INPUTS_A)), build(host, name(INPUTS_B))
    for turn in range(rv.HISTORY_MAX + 7):
        switch(host, os.path.basename(a if turn % 2 else b), at=f"t{turn}")
    entries = rv.read_history(host["state_dir"])["kinds"]["release"]
    assert len(entries) == rv.HISTORY_MAX
    assert entries[-1]["at"] == f"t{rv.HISTORY_MAX + 6}"


def test_prune_keeps_the_active_one_and_the_rollback_target_and_says_what_went(host):
    names = [name({**INPUTS_A, "n": n}) for n in range(4)]
    for n in names:
        build(host, n)
    switch(host, names[0], keep=9, at="t0")
    switch(host, names[1], keep=9, at="t1")
    switch(host, names[2], keep=9, at="t2")
    result = switch(host, names[3], keep=2, at="t3")
    # Active names[3], rollback target names[2]; the older two go.
    assert result["removed"] == [names[0], names[1]]
    assert sorted(os.listdir(host["versions_dir"])) == sorted(names[2:])
    # Back to names[2]: names[3] becomes the rollback target, so nothing goes.
    back = switch(host, names[2], keep=2, at="t4")
    assert back["removed"] == [] and back["rollback_target"] == names[3]
    # keep 1 still keeps the rollback target.
    assert switch(host, names[2], keep=1, at="t5")["removed"] == []
    assert sorted(os.listdir(host["versions_dir"])) == sorted(names[2:])
    with pytest.raises(rv.VersionError, match="keep must be 1 or more"):
        switch(host, names[2], keep=0)


def test_prune_removes_a_version_built_but_never_activated_first(host):
    a, b, never = name(INPUTS_A), name(INPUTS_B), name({"n": "never"})
    build(host, a)
    build(host, never)
    switch(host, a, keep=3, at="t0")
    build(host, b)
    result = switch(host, b, keep=2, at="t1")
    assert result["removed"] == [never]
    assert sorted(os.listdir(host["versions_dir"])) == sorted([a, b])


def test_rollback_goes_to_the_latest_other_version_and_a_second_rollback_changes_nothing(host):
    a, b = name(INPUTS_A), name(INPUTS_B)
    build(host, a)
    build(host, b)
    switch(host, a, at="t0")
    switch(host, b, at="t1")
    args = (host["link"], host["versions_dir"], host["state_dir"], "release", INPUTS_B)
    first = rv.rollback(*args, at="t2")
    assert first["changed"] and first["target"] == a and first["previous"] == b
    assert os.path.basename(os.path.realpath(host["link"])) == a
    second = rv.rollback(*args, at="t3")
    assert second["changed"] is False and second["target"] == a
    assert history_names(host) == [a, b, a]
    # The inputs of a (nothing activated before it that is still built): no target.
    nothing = rv.rollback(*args[:4], {"n": "fresh"}, at="t4")
    assert nothing["target"] == a  # a is not what these inputs build: it is a target
    only = rv.rollback(*args[:4], INPUTS_A, at="t5")
    assert only["target"] == b
    shutil_rm(host, b)
    gone = rv.rollback(*args[:4], INPUTS_A, at="t6")
    assert gone["target"] is None and gone["changed"] is False


def shutil_rm(host, version):
    import shutil

    shutil.rmtree(os.path.join(host["versions_dir"], version))


def test_the_module_fails_clearly_when_there_is_nothing_to_roll_back_to(host):
    build(host, name(INPUTS_A))
    switch(host, name(INPUTS_A))
    params = {
        "action": "rollback",
        "link": host["link"],
        "versions_dir": host["versions_dir"],
        "state_dir": host["state_dir"],
        "inputs": INPUTS_A,
        "host": "gpu-1",
    }
    failed = run_module("runtime_version", params)
    assert failed["failed"]
    assert failed["msg"].startswith("no previous runtime on gpu-1: the release runtime")
    assert name(INPUTS_A) in failed["msg"]
    planned = run_module("runtime_version", {**params, "action": "plan"})
    assert planned["name"] == name(INPUTS_A) and planned["active"] == name(INPUTS_A)
    assert planned["built"] and planned["rollback_target"] is None
    assert_unchanged(planned)


def test_a_real_venv_at_the_link_is_kept_as_the_rollback_target(host):
    os.makedirs(os.path.join(host["link"], "bin"))
    with open(os.path.join(host["link"], "bin", "python"), "w") as handle:
        handle.write("old")
    new = name(INPUTS_A)
    build(host, new)
    checked = switch(host, new, check=True)
    assert checked["changed"] and checked["migrated"] == "release-unversioned"
    assert os.path.isdir(host["link"]) and not os.path.islink(host["link"])
    result = switch(host, new, at="t1")
    assert result["migrated"] == "release-unversioned" and result["previous"] == result["migrated"]
    kept = os.path.join(host["versions_dir"], "release-unversioned", "bin", "python")
    with open(kept) as handle:
        assert handle.read() == "old"
    assert os.path.realpath(host["link"]) == os.path.join(
        os.path.realpath(host["versions_dir"]), new
    )
    assert history_names(host) == ["release-unversioned", new]
    back = rv.rollback(host["link"], host["versions_dir"], host["state_dir"], "release", INPUTS_A)
    assert back["target"] == "release-unversioned"
    # Never pruned, whatever keep says: nothing could rebuild it.
    for n in range(3):
        build(host, name({"n": n}))
        switch(host, name({"n": n}), keep=1)
    assert os.path.isfile(kept)
    # A second real folder while the first is kept: refused, neither is deleted.
    os.unlink(host["link"])
    os.makedirs(os.path.join(host["link"], "bin"))
    with pytest.raises(rv.VersionError, match="the kit deletes neither"):
        switch(host, name({"n": 2}))
    assert os.path.isdir(host["link"]) and os.path.isfile(kept)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe", "is not JSON"),
        (b"{not json", "is not JSON"),
        (b"[]", "is not a runtime history"),
        (b'{"format": 2, "kinds": {}}', "is not a runtime history"),
        (b'{"format": true, "kinds": {}}', "is not a runtime history"),
        (b"[" * 30000, "is not JSON"),
        (b'{"format": 1, "kinds": {"other": []}}', "kinds must map"),
        (b'{"format": 1, "kinds": {"release": {}}}', "must be a list of at most"),
        (b'{"format": 1, "kinds": {"release": [1]}}', "an entry without name and at"),
        (
            b'{"format": 1, "kinds": {"release": [{"name": "release-0123456789ab", "at": 5}]}}',
            "an entry without name and at",
        ),
        (
            b'{"format": 1, "kinds": {"release": [{"name": "../../etc", "at": "t"}]}}',
            "is not a runtime version",
        ),
        (
            b'{"format": 1, "kinds": {"git": [{"name": "release-0123456789ab", "at": "t"}]}}',
            "not a version of the git runtime",
        ),
        (
            json.dumps(
                {
                    "format": 1,
                    "kinds": {
                        "release": [{"name": "release-0123456789ab", "at": "t"}]
                        * (rv.HISTORY_MAX + 1)
                    },
                }
            ).encode(),
            "at most 20 entries",
        ),
        (b" " * (rv.HISTORY_MAX_BYTES + 1), "larger than"),
    ],
)
def test_a_bad_history_is_refused_with_the_fix(host, content, says):
    with open(os.path.join(host["state_dir"], rv.HISTORY_FILE), "wb") as handle:
        handle.write(content)
    build(host, name(INPUTS_A))
    with pytest.raises(rv.VersionError, match=says) as caught:
        switch(host, name(INPUTS_A))
    assert "move" in str(caught.value)
    assert not os.path.lexists(host["link"])


def test_the_launch_records_runtime_is_read_bounded_and_confined(host, tmp_path):
    record = tmp_path / "launch.json"
    a = build(host, name(INPUTS_A))
    record.write_text(json.dumps({"argv": ["x"], "runtime_dir": a}))
    assert rv.recorded_runtime(str(record), host["versions_dir"], "release") == {
        "runtime_dir": a,
        "name": name(INPUTS_A),
        "built": True,
    }
    # A version since removed is named, and said not to be there: no rollback can go to it.
    gone = os.path.join(host["versions_dir"], name(INPUTS_B))
    record.write_text(json.dumps({"runtime_dir": gone}))
    assert rv.recorded_runtime(str(record), host["versions_dir"], "release")["built"] is False
    nothing = {"runtime_dir": None, "name": None, "built": False}
    for content in (
        json.dumps({"runtime_dir": "/etc"}),
        json.dumps({"runtime_dir": os.path.join(host["versions_dir"], "..", "state")}),
        json.dumps({"runtime_dir": 5}),
        json.dumps({"argv": ["x"]}),
        "[1]",
        "not json",
        "[" * 30000,
        " " * (rv.LAUNCH_RECORD_MAX_BYTES + 1),
    ):
        record.write_text(content)
        assert rv.recorded_runtime(str(record), host["versions_dir"], "release") == nothing
    # Of the other kind: not a folder this kind's link may point at.
    record.write_text(json.dumps({"runtime_dir": a}))
    assert rv.recorded_runtime(str(record), host["versions_dir"], "git") == nothing
    assert rv.recorded_runtime(str(tmp_path / "missing"), host["versions_dir"]) == nothing


def test_the_module_switches_by_path_and_check_mode_changes_nothing(host):
    a = build(host, name(INPUTS_A))
    params = {
        "action": "switch",
        "link": host["link"],
        "versions_dir": host["versions_dir"],
        "state_dir": host["state_dir"],
        "path": a,
    }
    checked = run_module("runtime_version", params, check_mode=True)
    assert checked["changed"] and not os.path.lexists(host["link"])
    assert not os.path.exists(os.path.join(host["state_dir"], rv.HISTORY_FILE))
    done = run_module("runtime_version", params)
    assert done["changed"] and done["active"] == name(INPUTS_A)
    assert_unchanged(run_module("runtime_version", params))
    refused = run_module("runtime_version", {**params, "path": "/etc"})
    assert refused["failed"] and "is not a runtime version under" in refused["msg"]


def test_a_switch_outside_the_runtime_stage_puts_the_versions_record_into_runtime_json(host):
    a, b = build(host, name(INPUTS_A)), build(host, name(INPUTS_B))
    with open(os.path.join(a, rv.VERSION_RECORD), "w") as handle:
        json.dump({"version": "0.5.23", "runtime_dir": a}, handle)
    runtime_json = os.path.join(host["state_dir"], rv.RUNTIME_RECORD)
    with open(runtime_json, "w") as handle:
        json.dump({"release": {"version": "0.5.24", "runtime_dir": b}, "git": None}, handle)
    switch(host, name(INPUTS_B))
    back = switch(host, name(INPUTS_A), update_record=True)
    assert back["changed"]
    with open(runtime_json) as handle:
        restored = json.load(handle)
    assert restored == {"release": {"version": "0.5.23", "runtime_dir": a}, "git": None}
    assert switch(host, name(INPUTS_A), update_record=True)["changed"] is False
    # A version without its own record (as an unversioned one is): its entry says nothing
    # rather than naming another runtime.
    switch(host, name(INPUTS_B), update_record=True)
    with open(runtime_json) as handle:
        assert json.load(handle)["release"] is None
    # A runtime.json that is not an object is written anew, not trusted.
    with open(runtime_json, "w") as handle:
        handle.write("[1, 2]")
    assert switch(host, name(INPUTS_A), update_record=True)["changed"]
    with open(runtime_json) as handle:
        assert json.load(handle) == {"release": {"version": "0.5.23", "runtime_dir": a}}


def test_pruning_keeps_the_version_the_server_may_still_run_even_with_the_history_lost(host):
    """b serves; versions.json is moved aside (what its refusal tells users to do); a switch
    to c must keep b (what the link pointed at: the server runs on it until its restart) and
    name it the rollback target, whatever older version the folder holds."""
    a, b, c = name(INPUTS_A), name(INPUTS_B), name({**INPUTS_A, "python": "3.12.3"})
    build(host, a)
    build(host, b)
    switch(host, a, at="t1")
    switch(host, b, at="t2")
    build(host, c)
    os.rename(
        os.path.join(host["state_dir"], rv.HISTORY_FILE),
        os.path.join(host["state_dir"], "versions.json.aside"),
    )
    switched = switch(host, c, keep=2, at="t3")
    assert switched["previous"] == b and switched["rollback_target"] == b
    assert switched["removed"] == [a]
    assert sorted(os.listdir(host["versions_dir"])) == sorted([b, c])


def test_the_version_a_running_server_was_started_on_is_never_pruned(host, tmp_path):
    """Hardening II (2): A -> B, the server stage fails before its restart (the server still
    runs on A), then B -> C: only B, the link's previous target, was protected, so A went and
    the automatic rollback had nothing to go back to."""
    a, b, c = (name({**INPUTS_A, "n": n}) for n in "abc")
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"runtime_dir": os.path.join(host["versions_dir"], a)}))
    build(host, a)
    switch(host, a, keep=2, at="t0")
    build(host, b)
    switch(host, b, keep=2, at="t1")
    build(host, c)
    in_use = {rv.recorded_runtime(str(launch), host["versions_dir"], "release")["name"]}
    assert in_use == {a}
    result = switch(host, c, keep=2, at="t2", in_use=in_use)
    assert a not in result["removed"]
    assert os.path.isdir(os.path.join(host["versions_dir"], a))
    # The module reads the launch record itself.
    d = name({**INPUTS_A, "n": "d"})
    build(host, d)
    done = run_module(
        "runtime_version",
        {
            **host,
            "action": "switch",
            "kind": "release",
            "name": d,
            "keep": 2,
            "launch_record": str(launch),
        },
    )
    assert not done.get("failed"), done
    assert a not in done["removed"] and os.path.isdir(os.path.join(host["versions_dir"], a))
    # Without it, as before, A would have gone at the switch to C.
    assert sorted(done["removed"]) == sorted({b, c} - {done["rollback_target"]})
