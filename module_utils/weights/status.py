"""What a background weights download is doing, read from the status file weights_download
keeps and the async job's own record (library/weights_status.py): the state, a progress line for
people watching, and whether the wait is over.

A poll may wait (wait_s) until the download ends, reading the status file every half second,
instead of answering at once: a poll is a module run on the host, a Python started and Ansible's
module code imported, about 0.2 s of CPU. Waiting in it, the weights stage learns that a
download ended when it ends, not up to a poll interval later, from as many polls as before."""

from __future__ import annotations

from ansible.module_utils.host import async_job
from ansible.module_utils.host.helpers import look_until, pid_alive
from ansible.module_utils.weights.manifest import progress_line, read_json

FINAL = ("done", "failed", "gone", "ended")
# How often a waiting poll reads the status file: it changes once a second at most.
READ_EVERY_S = 0.5


def look(status_file: str, job_file: str | None) -> dict:
    """The download's state now."""
    status = read_json(status_file)
    job = read_json(job_file) if job_file else None
    job_ended = bool(job) and (job.get("finished") == 1 or job.get("failed"))
    if job_ended and (status is None or status.get("state") not in ("done", "failed")):
        # The job ended without a final status: its own result says why.
        return _answer("ended", "the download job ended; collecting its result", status or {})
    if status is None:
        return _answer("starting", "waiting for the download to start", {})
    state = status.get("state", "starting")
    if state not in ("done", "failed") and status.get("pid") and not pid_alive(status["pid"]):
        state = "gone"
        status["message"] = (
            f"the download process (pid {status['pid']}) ended without finishing, at "
            f"{status.get('bytes_done', 0)} of {status.get('bytes_total', 0)} bytes; it was "
            "killed or the host restarted. Rerun the playbook: completed files are kept."
        )
    progress = progress_line({**status, "state": state})
    if status.get("message") and state != "downloading":
        progress += f": {status['message']}"
    return _answer(state, progress, status)


def wait(status_file: str, job_file: str | None, wait_s: float) -> dict:
    """look(), again every READ_EVERY_S until the download ends or wait_s has passed."""
    return look_until(
        lambda: look(status_file, job_file), lambda found: found["done"], wait_s, READ_EVERY_S
    )


def download_job_file(async_dir: str, job_id: str | None) -> str | None:
    """The download job's result file (a job id that names anything else is refused)."""
    return async_job.job_file(async_dir, job_id) if job_id else None


def _answer(state: str, progress: str, status: dict) -> dict:
    return {
        "changed": False,
        "done": state in FINAL,
        "succeeded": state == "done",
        "state": state,
        "progress": progress,
        "status": status,
    }
