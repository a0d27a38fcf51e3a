"""The speed model's warnings (analysis/predicted_warnings.py) on hand-made rows: each cause of
a slow step names its part in order or lands in the message's checked or not-recorded list,
and acceptance below the published figure is one warning per host, config and prompt set."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis import predicted_warnings, telemetry

NOMINAL = {"allreduce_busbw_gbs": 300.0, "allreduce_latency_us": 8.0}
PROFILE_ALLREDUCE = {"ms": 2.0, "count": 60, "message_bytes": 14336}


def compared(step_ms: float, host_allreduce: dict | None = None, accepted_ratio=None) -> dict:
    """A row as analysis.predicted compares it, before its private fields are dropped."""
    parts = {"allreduce": host_allreduce} if host_allreduce else {}
    return {
        "host": "h1",
        "config": "eagle3",
        "prompt_set": "chat",
        "concurrency": 4,
        "profile": "h200",
        "tp_size": 8,
        "batch": 4,
        "verify_tokens_per_request": 4,
        "context_tokens": 900,
        "figures": "the profile's figures",
        "step_ms": step_ms,
        "accepted_tokens_per_step": 2.0,
        "accepted_tokens_per_step_predicted": 3.0,
        "accepted_tokens_per_step_ratio": accepted_ratio,
        "_parts": (parts, {"allreduce": PROFILE_ALLREDUCE}),
        "_where": "h1 / eagle3 / chat / c4",
    }


def level(saturated: bool = False) -> SimpleNamespace:
    client = {"saturated": saturated, "saturated_reasons": ["client CPU 0.98"]}
    return SimpleNamespace(client=client, summary={}, provenance={})


def slow(row, levels, figures=None) -> dict | None:
    return predicted_warnings.slow_warning(
        row, levels, {"step_ms": 10.0}, {"step_ms": 10.0}, figures or {}, NOMINAL
    )


@pytest.fixture
def held(monkeypatch):
    """Sets what the levels' GPU telemetry says of their clocks."""

    def set_to(found):
        monkeypatch.setattr(telemetry, "held_down", lambda summary, gpus: found)

    set_to(None)
    return set_to


def test_a_step_within_slow_of_the_model_warns_nothing(held):
    assert slow(compared(10.0 * (1 + predicted_warnings.SLOW)), [level()]) is None


def test_a_slow_step_without_records_says_what_was_not_recorded(held):
    warning = slow(compared(20.0), [level()])
    assert warning["kind"] == "slower_than_predicted" and warning["likely"] == []
    message = warning["message"]
    assert message.startswith("step time 20.0 ms is 100% above the speed model's 10.0 ms (h200")
    assert "Nothing the run recorded explains it." in message
    assert "Checked and not the cause: the client (not saturated)." in message
    assert (
        "Not recorded: the all-reduce (no all-reduce record in the run: the tuning stage's check "
        "writes it, the benchmark copies it into each level's provenance); the GPUs' clocks (no "
        "GPU telemetry at this level: benchmark_telemetry)."
    ) in message


def test_every_cause_found_is_named_strongest_evidence_first(held):
    held(
        {
            "reason": "power_cap",
            "share": 0.4,
            "sm_clock_mhz_mean": 1500.0,
            "sm_clock_max_mhz": 1980.0,
            "gpus": [3],
        }
    )
    slow_allreduce = {"ms": 9.0, "count": 60, "message_bytes": 14336}
    row = compared(20.0, slow_allreduce, accepted_ratio=0.5)
    warning = slow(row, [level(saturated=True)], figures={"allreduce_table": []})
    assert warning["likely"] == ["allreduce", "power_cap", "client_saturated"]
    message = warning["message"]
    likely = message.index("Likely: the all-reduce: this host's all-reduce check")
    assert likely < message.index("; the power cap: ") < message.index("; the client: ")
    assert "(SM clock 1500 of 1980 MHz)" in message and "(client CPU 0.98)" in message
    assert "Checked and not the cause" not in message and "Not recorded" not in message
    assert message.endswith("see acceptance_below_published.")


def test_a_record_that_does_not_explain_the_gap_is_checked_and_not_the_cause(held):
    held({"reason": None, "share": 0.0, "sm_clock_mhz_mean": 1900.0, "gpus": [0]})
    row = compared(20.0, {"ms": 2.1, "count": 60})
    warning = slow(row, [level()], figures={"allreduce_table": []})
    assert warning["likely"] == []
    assert (
        "Checked and not the cause: the all-reduce (this host's record: 35 us an all-reduce "
        "against the profile's 33 us); the GPUs' clocks (telemetry: no throttle reason, clocks "
        "near their maximum); the client (not saturated)."
    ) in warning["message"]


def test_low_acceptance_is_one_warning_per_host_config_and_prompt_set():
    def row(host, concurrency, ratio, verify=4):
        return {
            "host": host,
            "config": "eagle3",
            "prompt_set": "chat",
            "concurrency": concurrency,
            "verify_tokens_per_request": verify,
            "accepted_tokens_per_step": 1.5,
            "accepted_tokens_per_step_predicted": 3.0,
            "accepted_tokens_per_step_ratio": ratio,
            "acceptance_source": "published",
        }

    rows = [row("a", 8, 0.5), row("a", 1, 0.5), row("a", 4, 0.9), row("b", 1, 0.5, verify=1)]
    (found,) = predicted_warnings.acceptance_warnings(rows)
    assert found["where"] == "a / eagle3 / chat" and found["concurrencies"] == [8, 1]
    assert "c1 1.50 against 3.00, c8 1.50 against 3.00" in found["message"]
