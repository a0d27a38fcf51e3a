"""Waiting on the host for a task Ansible started in the background (`async`, `poll: 0`):
library/async_job_wait.py.

Ansible's own `poll` sleeps a poll interval, then runs async_status, a module run on the host
(a Python started, Ansible's module code imported: about 0.2 s of CPU), and so on until the job
ends, and cleans up with one more. Waiting here instead, one module run waits up to `wait_s`,
reading the job's result file every half second, and removes it once the job has ended: the
end is seen when it comes, not up to an interval later, from as many module runs at most.

The job's file is async_wrapper's: {"started": true, "finished": false, ...} while it runs,
then the module's own result; a file being replaced or cut short reads as still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

from ansible.module_utils.host.helpers import TooLarge, look_until, read_bounded

# What Ansible names its jobs (j<digits>.<pid>): a name, never a path (nor . or ..).
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
READ_EVERY_S = 0.5
# A module's result larger than this is not one a benchmark writes.
MAX_RESULT_BYTES = 64 << 20
# Async_wrapper's own keys, and the started module's arguments: not part of the result.
DROPPED = ("started", "finished", "invocation", "results_file")


def job_file(async_dir: str, job_id: str) -> str:
    """The job's result file under async_dir; refuses an id that would name anything else."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise ValueError(
            f"jid must be an async job id (letters, digits, '.', '_', '-'), found {job_id!r}"
        )
    return os.path.join(os.path.expanduser(async_dir), job_id)


def read(path: str) -> dict | None:
    """The job's record, or None while there is none to read whole."""
    try:
        raw = read_bounded(path, MAX_RESULT_BYTES)
    except TooLarge as error:
        raise ValueError(f"{error}: not a job's result") from None
    except OSError:
        return None
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def ended(record: dict | None) -> bool:
    """async_wrapper's first record has `started`; the module's result, written over it, not."""
    return record is not None and "started" not in record


def wait(path: str, wait_s: float) -> dict | None:
    """The job's final result once it has ended, else None after wait_s."""
    record = look_until(lambda: read(path), ended, wait_s, READ_EVERY_S)
    return record if ended(record) else None


def outcome(record: dict, job_id: str) -> dict:
    """What the task reports for an ended job: the module's result as the job wrote it."""
    result = {key: value for key, value in record.items() if key not in DROPPED}
    result.update(finished=True, ansible_job_id=job_id)
    result["changed"] = bool(result.get("changed", False))
    if result.get("failed"):
        result["failed"] = True
        result.setdefault("msg", f"the background job {job_id} failed without a message")
    return result


def check(async_dir: str, job_id: str, wait_s: float) -> dict:
    """One check: the ended job's outcome, its result file removed; else that it still runs."""
    path = job_file(async_dir, job_id)
    record = wait(path, wait_s)
    if record is None:
        return {
            "changed": False,
            "finished": False,
            "ansible_job_id": job_id,
            "msg": f"the background job {job_id} has not ended yet",
        }
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return outcome(record, job_id)
