"""Copies of the files ansible-playbook has loaded, by unpickling instead of copy.deepcopy, for
the ansible-playbook the tests run.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(never into the kit's own). It changes nothing a playbook does or reports.

Why: ansible-core's DataLoader keeps what each vars, defaults and group_vars file loaded to and
hands every caller a deep copy of it, so that no caller changes what the next one gets. The
data is ansible-core's tagged values (each string and container carries the file, line and
column it came from), which copy.deepcopy rebuilds object by object in Python: a tenth of a
test run's main process, about 0.2 CPU-s a run, over 190 runs a suite.

What: the first copy of a kept file pickles it once; every copy is then an unpickling of those
bytes, about a ninth of a deepcopy's time. pickle and copy.deepcopy rebuild an object by the
same protocol (its __reduce_ex__: ansible-core's tagged types define it for both), and both
keep the references one part of the data makes to another, so a caller gets the same fresh
objects. Data that does not pickle, and a load ansible-core did not keep (cache='none'), is
deep-copied as before.
"""

from __future__ import annotations

import copy
import pickle

MODULE = "ansible.parsing.dataloader"


def patch(module) -> bool:
    loader = module.DataLoader
    original = loader.load_from_file
    if getattr(original, "kimi_pickled_copies", False):
        return False
    # id of a kept parse -> (the parse, its pickle or None): holding the parse keeps its id
    # from naming any other object, so an entry found by id is that parse's.
    pickled: dict[int, tuple[object, bytes | None]] = {}

    def load_from_file(self, file_name, cache="all", unsafe=False, json_only=False, **kwargs):
        parsed = original(self, file_name, cache=cache, unsafe=True, json_only=json_only, **kwargs)
        if unsafe:
            return parsed
        if not any(kept is parsed for kept in self._FILE_CACHE.values()):
            return copy.deepcopy(parsed)
        entry = pickled.get(id(parsed))
        if entry is None:
            try:
                data = pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                data = None
            entry = pickled[id(parsed)] = (parsed, data)
        if entry[1] is None:
            return copy.deepcopy(parsed)
        # Pickled above, in this process, from what ansible-core loaded.
        return pickle.loads(entry[1])  # noqa: S301

    load_from_file.kimi_pickled_copies = True
    loader.load_from_file = load_from_file
    return True
