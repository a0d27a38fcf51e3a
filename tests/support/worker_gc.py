"""Keeps a task worker's garbage collector off ansible-playbook's own objects, for the
ansible-playbook the tests run.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(never into the kit's own). It changes nothing a playbook does or reports.

Why: ansible-playbook forks a worker for every task on every host, and a forked process shares
its parent's memory only until it writes to it. A collection of the oldest generation in the
worker visits every object the parent holds (the loaded plugins, the inventory, the variables,
the parsed playbook) and writes to each object's header, so the worker copies most of the
parent's memory page by page: two integration files (test_tags.py, test_rollout.py) took 35
CPU-s with this against 43, their test hosts included.

What: gc.freeze() just before each worker forks moves every object the parent then tracks to
the permanent generation, which no collection visits, in the worker or in the parent; objects
made later are collected as before. What the parent held at a fork and let go of later is not
collected until the process ends: an ansible-playbook of the tests lives for a few minutes.
"""

from __future__ import annotations

import gc

MODULE = "ansible.executor.process.worker"


def patch(module) -> None:
    process = module.WorkerProcess
    if getattr(process.start, "kimi_gc_freeze", False):
        return
    start = process.start

    def start_frozen(self, *args, **kwargs):
        gc.freeze()
        return start(self, *args, **kwargs)

    start_frozen.kimi_gc_freeze = True
    process.start = start_frozen
