"""Runs the tasks that never reach a host inside ansible-playbook, without a worker fork, for
the ansible-playbook the tests run.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(KIT_TEST_INLINE_TASKS=1), never into the kit's own. It changes nothing a playbook does or
reports: the task runs through ansible-core's own TaskExecutor, its result goes through the
same result queue and callbacks as a worker's.

Why: ansible-playbook forks a worker for every task on every host, even for a task that only
templates (set_fact, debug, assert, fail, an include, a role's argument check) and for one
whose `when` is false. A fork of ansible-playbook costs more than such a task: the kernel
copies the page tables, and every page either process writes afterwards is copied or
faulted (about 2,400 faults in the parent and 3,200 in the worker per fork in make test).
Those tasks are half of the suite's task-host pairs.

What: when a worker is about to fork, a task that has no loop, no timeout and no async runs
in ansible-playbook itself on a copy of the task (a worker mutates its task and the task's
blocks as it post-validates them: a fork's copy in a worker), where
- its action is one of INLINE_ACTIONS, which never reach a host: it runs to
  its end;
- any other action has a `when`: it runs until its conditional is resolved; a false one is
  the task's skip result, and a true one stops the run there (nothing past the conditional
  has happened) and the worker forks as before, evaluating it again.
"""

from __future__ import annotations

MODULE = "ansible.executor.process.worker"

# Actions whose whole run is in the worker and never on a host: ansible-core's that only
# template (include_role and include_tasks return their arguments for the strategy to expand)
# and the kit's whose work is the controller's (action_plugins/kit_in_process.py; autotune's
# steps and the wheelhouse's archive, which start processes of their own, are left to fork).
_CORE = (
    "set_fact",
    "debug",
    "assert",
    "fail",
    "validate_argument_spec",
    "include_tasks",
    "include_role",
    "include_vars",
)
_KIT = (
    "kimi_settings_check",
    "study_lock",
    "serving_render",
    "capacity_plan",
    "controller_files",
    "hub_repo_info",
)
INLINE_ACTIONS = frozenset(
    (
        *_CORE,
        *_KIT,
        *(f"ansible.builtin.{name}" for name in _CORE),
        *(f"ansible.legacy.{name}" for name in (*_CORE, *_KIT)),
    )
)


class _Forks(BaseException):
    """Raised where an inline run stops: the task needs a worker. A BaseException, so that
    TaskExecutor's handlers, which turn every Exception into a failed result, let it by."""


def inline_kind(task) -> str | None:
    """'run' (to the end), 'when' (up to the conditional) or None (fork)."""
    if task.loop_with or task.loop is not None or task.async_val or task.timeout:
        return None
    if task.action in INLINE_ACTIONS:
        return "run"
    return "when" if task.when else None


def _stop_when_true(resolve):
    def resolve_or_fork(conditional, variables, **kwargs):
        if resolve(conditional, variables, **kwargs):
            raise _Forks()
        return False

    return resolve_or_fork


def run_inline(worker) -> bool:
    """Runs the worker's task here if it can; True when its result has been sent."""
    from ansible._internal import _task
    from ansible._internal._errors import _error_utils
    from ansible.errors import AnsibleError
    from ansible.executor.task_executor import TaskExecutor
    from ansible.executor.task_result import _RawTaskResult

    kind = inline_kind(worker._task)
    if kind is None:
        return False
    task = worker._task.copy(exclude_tasks=True)
    if kind == "when":
        task._resolve_conditional = _stop_when_true(task._resolve_conditional)
    try:
        with _task.TaskContext(task):
            result = TaskExecutor(
                worker._host,
                task,
                worker._task_vars,
                worker._play_context,
                worker._loader,
                worker._shared_loader_obj,
                worker._final_q,
                worker._variable_manager,
            ).run()
    except _Forks:
        return False
    try:
        worker._final_q.send_task_result(
            _RawTaskResult(
                host=worker._host, task=task, return_data=result, task_fields=task.dump_attrs()
            )
        )
    except Exception as ex:
        # What a worker sends when its result does not pickle (worker.py).
        try:
            raise AnsibleError("Task result omitted due to queue send failure.") from ex
        except Exception as wrapper:
            worker._final_q.send_task_result(
                _RawTaskResult(
                    host=worker._host,
                    task=task,
                    return_data=_error_utils.result_dict_from_exception(wrapper),
                    task_fields={},
                )
            )
    return True


def patch(module) -> None:
    process = module.WorkerProcess
    if getattr(process.start, "kimi_inline", False):
        return
    start = process.start

    def start_or_run_inline(self, *args, **kwargs):
        if not run_inline(self):
            return start(self, *args, **kwargs)

    start_or_run_inline.kimi_inline = True
    process.start = start_or_run_inline
