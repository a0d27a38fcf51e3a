"""controller_files (action_plugins/controller_files.py): the kit's records on the controller,
written inside ansible-playbook's worker by module_utils/server/files.py, as server_files writes
on a host. One local ansible-playbook run under the kit's ansible.cfg: the first write creates
the folder and the file, a second finds nothing to change, check mode with diff says what it
would write and writes nothing, and bad entries fail naming the path and the fix."""

from __future__ import annotations

import json
import stat

from tests.support.ansible_run import run_local_playbook

PLAYBOOK = """\
- name: The controller's records
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    folder: "{root}/state/gpu-1"
    record: {{kind: kimi.test, hosts: [gpu-1]}}
  tasks:
    - name: Record it
      controller_files:
        files:
          - {{path: "{{{{ folder }}}}", state: directory, mode: "0750"}}
          - path: "{{{{ folder }}}}/record.json"
            content: "{{{{ record | to_nice_json }}}}\\n"
            mode: "0640"
      register: first
    - name: Record it again
      controller_files:
        files:
          - {{path: "{{{{ folder }}}}", state: directory, mode: "0750"}}
          - path: "{{{{ folder }}}}/record.json"
            content: "{{{{ record | to_nice_json }}}}\\n"
            mode: "0640"
      register: second
    - name: Say what another record would change
      controller_files:
        files:
          - {{path: "{{{{ folder }}}}/record.json", content: "changed\\n", mode: "0640"}}
      check_mode: true
      diff: true
      register: checked
    - name: A relative path
      controller_files:
        files:
          - {{path: "state/gpu-1/x.json", content: "x", mode: "0644"}}
      ignore_errors: true
      register: relative
    - name: A secret
      controller_files:
        files:
          - {{path: "{{{{ folder }}}}/key", secret: true, mode: "0600"}}
      ignore_errors: true
      register: secret
    - name: Nothing to write
      controller_files:
        files: []
      ignore_errors: true
      register: empty
    - name: Keep what each said
      controller_files:
        files:
          - path: "{root}/said.json"
            mode: "0644"
            content: >-
              {{{{ {{'first': first, 'second': second, 'checked': checked, 'relative': relative,
                   'secret': secret, 'empty': empty}} | to_json }}}}
"""


def test_records_are_written_once_checked_and_bad_entries_refused(tmp_path):
    playbook = tmp_path / "records.yml"
    playbook.write_text(PLAYBOOK.format(root=tmp_path))
    done = run_local_playbook(playbook)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = json.loads((tmp_path / "said.json").read_text())
    folder = tmp_path / "state" / "gpu-1"
    record = folder / "record.json"
    assert said["first"]["changed"] is True
    # The missing state/ too, as mkdir -p makes it.
    assert said["first"]["changed_paths"] == [str(folder.parent), str(folder), str(record)]
    assert json.loads(record.read_text()) == {"kind": "kimi.test", "hosts": ["gpu-1"]}
    modes = {stat.S_IMODE(path.stat().st_mode) for path in (folder, folder.parent)}
    assert modes == {0o750}
    assert stat.S_IMODE(record.stat().st_mode) == 0o640
    assert said["second"]["changed"] is False and said["second"]["changed_paths"] == []
    # Check mode says what would change, with the diff, and writes nothing.
    assert said["checked"]["changed"] is True
    [diff] = said["checked"]["diff"]
    assert diff["after"] == "changed\n" and '"kind": "kimi.test"' in diff["before"]
    assert json.loads(record.read_text())["kind"] == "kimi.test"
    assert said["relative"]["failed"] is True
    refused = said["relative"]["msg"]
    assert "controller_files: 'state/gpu-1/x.json' is not a plain absolute path" in refused
    assert said["secret"]["failed"] is True
    assert "never a secret, template or src" in said["secret"]["msg"]
    assert said["empty"]["failed"] is True and "non-empty list" in said["empty"]["msg"]
    assert not (folder / "key").exists()
