"""async_job_wait (module_utils/host/async_job.py): the benchmark's wait on the host for its
background run, in place of Ansible's poll."""

from __future__ import annotations

import json
import threading
import time

import pytest
from ansible.module_utils.host import async_job

from tests.support.modules import run_module

JID = "j123456789012.4242"
RUNNING = {"started": True, "finished": False, "ansible_job_id": JID}


def job(tmp_path, record) -> str:
    (tmp_path / JID).write_text(record if isinstance(record, str) else json.dumps(record))
    return str(tmp_path)


def test_a_check_answers_when_the_job_ends_with_its_result_and_removes_the_file(tmp_path):
    async_dir = job(tmp_path, RUNNING)
    done = {"changed": True, "summaries": {"c1": {"output_tokens_per_s": 9.5}}, "invocation": {}}
    ends = threading.Timer(1.0, lambda: job(tmp_path, done))
    ends.start()
    started = time.monotonic()
    result = run_module("async_job_wait", {"jid": JID, "async_dir": async_dir, "wait_s": 30})
    ends.join()
    assert time.monotonic() - started < 10
    assert result["finished"] is True and result["changed"] is True
    assert result["summaries"] == done["summaries"] and result["ansible_job_id"] == JID
    assert not (tmp_path / JID).exists()


def test_a_running_job_is_answered_when_the_wait_is_over(tmp_path):
    async_dir = job(tmp_path, RUNNING)
    started = time.monotonic()
    result = run_module("async_job_wait", {"jid": JID, "async_dir": async_dir, "wait_s": 1.2})
    assert 1.0 <= time.monotonic() - started < 8
    assert result["finished"] is False and not result.get("failed") and not result["changed"]
    assert (tmp_path / JID).exists()
    # A result file being written (cut short) or not there yet is a job still running.
    for record in ('{"started": tru', None):
        if record is None:
            (tmp_path / JID).unlink()
        else:
            job(tmp_path, record)
        found = run_module("async_job_wait", {"jid": JID, "async_dir": async_dir})
        assert found["finished"] is False


def test_a_failed_job_fails_the_check_with_its_message(tmp_path):
    failure = {"failed": True, "msg": "crashed during concurrency 1 of eagle3", "changed": False}
    result = run_module("async_job_wait", {"jid": JID, "async_dir": job(tmp_path, failure)})
    assert result["failed"] and result["finished"] is True
    assert result["msg"] == "crashed during concurrency 1 of eagle3"
    silent = run_module("async_job_wait", {"jid": JID, "async_dir": job(tmp_path, {"failed": 1})})
    assert silent["failed"] and f"background job {JID} failed" in silent["msg"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"jid": "../etc/passwd"}, "jid must be an async job id"),
        ({"jid": ".."}, "jid must be an async job id"),
        ({"jid": "a/b"}, "jid must be an async job id"),
        ({"jid": JID, "wait_s": -1}, "wait_s must be between 0 and 3600"),
        ({"jid": JID, "wait_s": 3601}, "wait_s must be between 0 and 3600"),
    ],
)
def test_bad_input_is_refused_naming_it(tmp_path, args, says):
    result = run_module("async_job_wait", {"async_dir": str(tmp_path), **args})
    assert result["failed"] and says in result["msg"], result


def test_hostile_records_never_raise_past_the_module(tmp_path, monkeypatch):
    monkeypatch.setattr(async_job, "MAX_RESULT_BYTES", 64)
    too_big = run_module(
        "async_job_wait", {"jid": JID, "async_dir": job(tmp_path, {"x": "y" * 100})}
    )
    assert too_big["failed"] and "not a job's result" in too_big["msg"]
    for record in ("[1, 2]", "null", '"text"', "7"):
        found = run_module("async_job_wait", {"jid": JID, "async_dir": job(tmp_path, record)})
        assert found["finished"] is False, record
