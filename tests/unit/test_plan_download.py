"""plan.md's download time (module_utils/plan/download.py): the size at the hosts' bandwidth,
a bad bandwidth refused naming kimi_download_gbps."""

from __future__ import annotations

import math

import pytest
from ansible.module_utils.plan.download import download_time, duration_words

# Kimi K2.6's checkpoint as the capacity plan counts it (554.27 GiB).
K26_BYTES = int(554.27 * 2**30)


def test_the_k26_download_takes_about_an_hour_and_a_half_at_1_gbit_and_9_min_at_10():
    at_one, at_ten = download_time(1, K26_BYTES), download_time(10.0, K26_BYTES)
    assert at_one == {"gbps": 1.0, "seconds": round(K26_BYTES * 8 / 1e9, 1)}
    assert duration_words(at_one["seconds"]) == "about 1 h 19 min"
    assert duration_words(at_ten["seconds"]) == "about 8 min"
    assert download_time(2.5, None) == {"gbps": 2.5, "seconds": None}


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(None, "unknown"), (0, "under a minute"), (29, "under a minute"), (31, "about 1 min"),
     (3600, "about 1 h 0 min"), (7260, "about 2 h 1 min")],
)  # fmt: skip
def test_duration_words(seconds, words):
    assert duration_words(seconds) == words


@pytest.mark.parametrize("gbps", [0, -1, math.inf, math.nan, True, "10", None, 10_001])
def test_a_bandwidth_that_is_not_one_is_refused_naming_the_setting(gbps):
    with pytest.raises(ValueError, match=r"kimi_download_gbps is .*Fix: set kimi_download_gbps"):
        download_time(gbps, 1)


@pytest.mark.parametrize("size", [-1, 1.5, "595 GB", True])
def test_a_size_that_is_not_bytes_is_refused(size):
    with pytest.raises(ValueError, match="download size"):
        download_time(1, size)
