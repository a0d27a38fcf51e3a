"""server_files (module_utils/server/files.py, library/server_files.py and its action plugin):
the server's folders and files in one module run, every file private while it is written, no
change where nothing differs, bad entries refused naming the path, secrets never returned."""

from __future__ import annotations

import grp
import json
import os
import stat
import tempfile
import textwrap
from pathlib import Path

import pytest
from ansible.module_utils.server import files as server_files

from tests.support.ansible_run import run_local_playbook
from tests.support.modules import assert_unchanged, run_module

REPO = Path(__file__).resolve().parents[2]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def entries(root: Path) -> list[dict]:
    return [
        {"path": str(root / "etc"), "state": "directory", "mode": "0755"},
        {"path": str(root / "log"), "state": "directory", "mode": "0750"},
        {"path": str(root / "etc" / "unit.service"), "content": "[Unit]\n", "mode": "0644"},
        {"path": str(root / "log" / "server.log"), "state": "touch", "mode": "0600"},
        {"path": str(root / "etc" / "old.yml"), "state": "absent"},
    ]


def test_one_run_makes_folders_files_and_the_log_and_a_second_changes_nothing(tmp_path):
    (tmp_path / "etc").mkdir(mode=0o700)
    (tmp_path / "etc" / "old.yml").write_text("api_key: gone\n")
    first = run_module("server_files", {"files": entries(tmp_path)})
    assert first["changed"] is True and not first.get("failed"), first
    assert first["changed_paths"] == [e["path"] for e in entries(tmp_path)]
    assert mode_of(tmp_path / "etc") == 0o755 and mode_of(tmp_path / "log") == 0o750
    assert (tmp_path / "etc" / "unit.service").read_text() == "[Unit]\n"
    assert mode_of(tmp_path / "etc" / "unit.service") == 0o644
    assert (tmp_path / "log" / "server.log").read_bytes() == b""
    assert mode_of(tmp_path / "log" / "server.log") == 0o600
    assert not (tmp_path / "etc" / "old.yml").exists()
    assert_unchanged(run_module("server_files", {"files": entries(tmp_path)}))
    # No temporary file is left beside what was written.
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["unit.service"]


def test_a_changed_content_or_mode_is_rewritten_and_only_that(tmp_path):
    run_module("server_files", {"files": entries(tmp_path)})
    unit = tmp_path / "etc" / "unit.service"
    unit.write_text("[Unit]\nlocal edit\n")
    os.chmod(tmp_path / "log", 0o700)
    result = run_module("server_files", {"files": entries(tmp_path)})
    assert result["changed_paths"] == [str(tmp_path / "log"), str(unit)]
    assert unit.read_text() == "[Unit]\n" and mode_of(tmp_path / "log") == 0o750
    # Same size, other bytes: still a change.
    unit.write_text("[Unix]\n")
    assert run_module("server_files", {"files": entries(tmp_path)})["changed_paths"] == [str(unit)]


def test_an_existing_log_keeps_its_content_and_times_and_gets_its_mode(tmp_path):
    run_module("server_files", {"files": entries(tmp_path)})
    log = tmp_path / "log" / "server.log"
    log.write_text("served\n")
    os.chmod(log, 0o644)
    os.utime(log, (1_000_000, 2_000_000))
    result = run_module("server_files", {"files": entries(tmp_path)})
    assert result["changed_paths"] == [str(log)]
    assert (log.stat().st_atime, log.stat().st_mtime) == (1_000_000, 2_000_000)
    assert log.read_text() == "served\n" and mode_of(log) == 0o600


def test_check_mode_reports_the_changes_and_makes_none(tmp_path):
    result = run_module("server_files", {"files": entries(tmp_path)}, check_mode=True)
    assert result["changed"] is True
    assert result["changed_paths"] == [e["path"] for e in entries(tmp_path)[:4]]
    assert list(tmp_path.iterdir()) == []


def test_every_file_is_private_until_it_has_its_content_and_mode(tmp_path, monkeypatch):
    """What a reader could open while a file is written: the temporary file is created 0600 by
    mkstemp (O_EXCL), gets its final mode before the rename, and is never the path itself."""
    seen = []
    real_mkstemp, real_replace = tempfile.mkstemp, os.replace

    def mkstemp(**kwargs):
        descriptor, path = real_mkstemp(**kwargs)
        seen.append(("created", os.path.dirname(path), mode_of(Path(path))))
        return descriptor, path

    def replace(source, target):
        seen.append(("renamed", Path(source).read_text(), mode_of(Path(source))))
        real_replace(source, target)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "replace", replace)
    folder = tmp_path / "etc"
    folder.mkdir()
    wanted = [
        {"path": str(folder / "secrets.yml"), "secret": True, "mode": "0600"},
        {"path": str(folder / "unit.service"), "content": "[Unit]\n", "mode": "0644"},
    ]
    checked = server_files.check_entries(wanted, {str(folder / "secrets.yml"): "api_key: k\n"})
    server_files.apply(checked)
    assert seen == [
        ("created", str(folder), 0o600),
        ("renamed", "api_key: k\n", 0o600),
        ("created", str(folder), 0o600),
        ("renamed", "[Unit]\n", 0o644),
    ]


@pytest.mark.parametrize("state", ["directory", "touch"])
def test_one_made_meanwhile_by_another_process_is_taken_as_found(tmp_path, monkeypatch, state):
    """Two hosts' tasks on one controller make the same state/ folder: the one that looked
    first and creates second finds it made, and goes on (it failed with "File exists")."""
    path = tmp_path / "state"
    real_mkdir, real_open = os.mkdir, os.open

    def make_first(target, *args, **kwargs):
        if str(target) == str(path):
            # The other process, between this one's look and its create.
            if state == "directory":
                real_mkdir(target, 0o700)
            else:
                os.close(real_open(target, os.O_WRONLY | os.O_CREAT, 0o600))
            raise FileExistsError(17, "File exists", str(target))
        return (real_mkdir if state == "directory" else real_open)(target, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir" if state == "directory" else "open", make_first)
    wanted = [{"path": str(path), "state": state, "mode": "0750"}]
    done = server_files.apply(server_files.with_parents(server_files.check_entries(wanted)))
    assert done["changed_paths"] == [str(path)]  # its mode was the other's private one
    assert mode_of(path) == 0o750
    assert path.is_dir() if state == "directory" else path.is_file()
    monkeypatch.undo()
    assert server_files.apply(server_files.check_entries(wanted))["changed"] is False


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "unit.service"
    target.write_text("old\n")

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    checked = server_files.check_entries(
        [{"path": str(target), "content": "new\n", "mode": "0644"}]
    )
    with pytest.raises(server_files.FilesError, match=r"unit\.service: No space left on device"):
        server_files.apply(checked)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_secret_is_written_but_never_returned_or_diffed(tmp_path):
    secret = "api_key: sk-server-files-5d1e\n"
    path = str(tmp_path / "secrets.yml")
    args = {
        "files": [
            {"path": path, "secret": True, "mode": "0600"},
            {"path": str(tmp_path / "shown.txt"), "content": "shown\n", "mode": "0644"},
        ],
        "secret_contents": {path: secret},
        "_ansible_diff": True,
    }
    result = run_module("server_files", args)
    assert Path(path).read_text() == secret and mode_of(Path(path)) == 0o600
    assert "sk-server-files" not in json.dumps(result)
    assert [d["after_header"] for d in result["diff"]] == [str(tmp_path / "shown.txt")]
    assert result["diff"][0]["after"] == "shown\n"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "etc/kimi", "state": "directory", "mode": "0755"}, "not a plain absolute path"),
        ({"path": "/etc/../kimi", "state": "directory", "mode": "0755"}, "not a plain absolute"),
        ({"path": "/etc//kimi", "state": "directory", "mode": "0755"}, "not a plain absolute"),
        ({"path": "/etc/kimi", "state": "directory", "mode": "755x"}, "not an octal mode"),
        ({"path": "/etc/kimi", "state": "directory", "mode": 493}, "not an octal mode"),
        ({"path": "/etc/kimi", "state": "directory"}, "needs a mode"),
        ({"path": "/etc/kimi/a", "mode": "0644"}, "needs its content as text"),
        ({"path": "/etc/kimi/a", "state": "touch", "mode": "0600", "content": "x"}, "only for"),
        ({"path": "/etc/kimi/a", "mode": "0644", "template": "a.j2"}, "action plugin"),
        ({"path": "/etc/kimi/a", "mode": "0600", "secret": True}, "needs its content in secret"),
        (
            {
                "path": "/etc/kimi/a",
                "mode": "0644",
                "content": "x" * (server_files.MAX_CONTENT_BYTES + 1),
            },
            "over the",
        ),
    ],
)
def test_a_bad_entry_is_refused_naming_it_before_anything_is_written(tmp_path, entry, message):
    first = {"path": str(tmp_path / "made"), "state": "directory", "mode": "0755"}
    result = run_module("server_files", {"files": [first, entry]})
    assert result.get("failed") and message in result["msg"], result
    assert result["msg"].startswith("The server's files: ")
    assert not (tmp_path / "made").exists()


def test_a_path_of_the_wrong_kind_is_refused_naming_it(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    for entry, message in (
        ({"path": str(tmp_path / "dir"), "content": "x", "mode": "0644"}, "is a folder"),
        ({"path": str(tmp_path / "file"), "state": "directory", "mode": "0755"}, "not a folder"),
        ({"path": str(tmp_path / "dir"), "state": "touch", "mode": "0600"}, "not a regular"),
        ({"path": str(tmp_path / "dir"), "state": "absent"}, "only files are removed"),
    ):
        result = run_module("server_files", {"files": [entry]})
        assert result.get("failed") and message in result["msg"] and entry["path"] in result["msg"]


def test_the_action_plugin_renders_each_template_as_the_template_module_does(tmp_path):
    """The role's own templates: a host deployed before server_files sees no change."""
    role = REPO / "roles" / "server" / "templates"
    out = tmp_path / "out"
    out.mkdir()
    unit, rotate, env = "kimi-sglang.service.j2", "kimi-sglang.logrotate.j2", "server.env.j2"
    script, script_src = "kimi_supervise.py", role.parent / "files" / "kimi_supervise.py"
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: localhost
              connection: local
              gather_facts: false
              vars:
                server_model_title: Kimi K2.6
                server_restart_max: 3
                server_restart_window_s: 600
                server_restart_delay_s: 10
                server_stop_timeout_s: 120
                server_file_limit: 1048576
                server_config_dir: /etc/kimi
                server_state_dir: /var/lib/kimi/server
                server_unit_name: kimi-sglang
                server_log_file: /var/log/kimi/kimi-sglang.log
                server_log_rotate_size: 1G
                server_log_rotate_keep: 4
                __server_identity: {{file: /etc/kimi/kimi-sglang.identity}}
                __server_shown:
                  name: dflash
                  runtime: sglang==0.5.23
                  argv: [/opt/kimi/venv/bin/python, -m, sglang.launch_server, --tp-size, "8"]
                __server_environment: {{NCCL_P2P_DISABLE: "1", HOME: /root}}
              tasks:
                - name: As the template module writes them
                  ansible.builtin.template:
                    src: "{role}/{{{{ item }}}}"
                    dest: "{out}/template-{{{{ item }}}}"
                    mode: "0644"
                  loop: [{unit}, {rotate}, {env}]
                - name: As server_files writes them
                  server_files:
                    files:
                      - {{path: "{out}/action-{unit}", template: "{role}/{unit}", mode: "0644"}}
                      - {{path: "{out}/action-{rotate}", template: "{role}/{rotate}", mode: "0644"}}
                      - path: "{out}/action-{env}"
                        template: "{role}/{env}"
                        secret: true
                        mode: "0600"
                      - {{path: "{out}/action-{script}", src: "{script_src}", mode: "0755"}}
            """
        )
    )
    run = run_local_playbook(playbook, ANSIBLE_NOCOLOR="1")
    assert run.returncode == 0, run.stdout + run.stderr
    for name in (unit, rotate, env):
        assert (out / f"action-{name}").read_bytes() == (out / f"template-{name}").read_bytes()
    assert 'NCCL_P2P_DISABLE="1"' in (out / f"action-{env}").read_text()
    assert mode_of(out / f"action-{env}") == 0o600
    copied = out / f"action-{script}"
    assert copied.read_bytes() == script_src.read_bytes() and mode_of(copied) == 0o755
    # The environment file is secret: its content never reaches the output.
    assert "HOME=" not in run.stdout and "/root" not in run.stdout


OWNERS = ("owner", "group")


def test_owners_are_set_on_what_is_made_and_put_back_when_changed(tmp_path):
    """The weights stage's folders: a gated repository's is group-owned by the service group."""
    other = grp.getgrnam("daemon")
    gated, open_ = tmp_path / "gated", tmp_path / "open"
    folders = [
        {"path": str(gated), "state": "directory", "mode": "0750", "group": "daemon"},
        {"path": str(open_), "state": "directory", "mode": "0755", **dict.fromkeys(OWNERS, "root")},
    ]
    first = run_module("server_files", {"files": folders})
    assert first["changed_paths"] == [str(gated), str(open_)], first
    assert (gated.stat().st_gid, mode_of(gated)) == (other.gr_gid, 0o750)
    assert (open_.stat().st_uid, open_.stat().st_gid) == (0, 0)
    assert_unchanged(run_module("server_files", {"files": folders}))
    # Someone changed the group: only that folder is put back, its mode untouched.
    os.chown(open_, -1, other.gr_gid)
    again = run_module("server_files", {"files": folders})
    assert again["changed_paths"] == [str(open_)] and open_.stat().st_gid == 0
    # A file gets its owners after its content, and keeps them.
    record = {"path": str(gated / "r.json"), "content": "{}\n", "mode": "0640", "group": "daemon"}
    assert run_module("server_files", {"files": [record]})["changed"]
    assert (gated / "r.json").stat().st_gid == other.gr_gid
    assert_unchanged(run_module("server_files", {"files": [record]}))


def test_a_folder_goes_whole_only_with_recurse(tmp_path):
    """The benchmark clears what an earlier attempt left for a config, then makes it again."""
    config = tmp_path / "run" / "ar"
    (config / "gsm8k").mkdir(parents=True)
    (config / "gsm8k" / "c1.json").write_text("{}")
    again = [
        {"path": str(config), "state": "absent", "recurse": True},
        {"path": str(config), "state": "directory", "mode": "0755"},
    ]
    result = run_module("server_files", {"files": again})
    assert result["changed_paths"] == [str(config), str(config)], result
    assert list(config.iterdir()) == []
    # A link is removed as a link, never followed.
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "kept")
    link = {"path": str(tmp_path / "link"), "state": "absent", "recurse": True}
    assert run_module("server_files", {"files": [link]})["changed"]
    assert (tmp_path / "kept" / "mine.txt").read_text() == "mine"
    assert not (tmp_path / "link").is_symlink()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"state": "directory", "mode": "0755", "group": "no-such-group-x"}, "no group"),
        ({"state": "directory", "mode": "0755", "owner": "no-such-user-x"}, "no owner"),
        ({"state": "directory", "mode": "0755", "group": "Kimi; rm"}, "not a user or group"),
        ({"state": "directory", "mode": "0755", "owner": ""}, "not a user or group"),
        ({"state": "absent", "group": "root"}, "not for absent"),
        ({"state": "directory", "mode": "0755", "recurse": True}, "only for absent"),
    ],
)
def test_bad_owners_and_recurse_are_refused_naming_the_path(tmp_path, entry, message):
    made = tmp_path / "made"
    result = run_module("server_files", {"files": [{"path": str(made), **entry}]})
    assert result.get("failed") and message in result["msg"] and str(made) in result["msg"]
    assert not made.exists()
