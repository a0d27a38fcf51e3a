"""How long the plan's download takes at a bandwidth: plan.json's download_time and the words
plan.md shows for it."""

from __future__ import annotations

import math

MAX_GBPS = 10_000.0  # far above any host's link: a larger figure is a typo


def download_time(gbps, total_bytes) -> dict:
    """{"gbps", "seconds"}: total_bytes at gbps Gbit/s (10^9 bits a second); seconds None when
    the size is unknown. ValueError for a bandwidth that is not a number from above 0 to
    MAX_GBPS, or a size that is not a whole number of bytes."""
    if (
        isinstance(gbps, bool)
        or not isinstance(gbps, (int, float))
        or not math.isfinite(gbps)
        or not 0 < gbps <= MAX_GBPS
    ):
        raise ValueError(
            f"kimi_download_gbps is {gbps!r}; needed: the hosts' download bandwidth in Gbit/s, "
            f"above 0 and at most {MAX_GBPS:g}. Fix: set kimi_download_gbps."
        )
    if total_bytes is None:
        return {"gbps": float(gbps), "seconds": None}
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 0:
        raise ValueError(f"the download size is {total_bytes!r}; needed: a whole number of bytes")
    return {"gbps": float(gbps), "seconds": round(total_bytes * 8 / (gbps * 1e9), 1)}


def duration_words(seconds) -> str:
    """'about 1 h 20 min', 'about 3 min', 'under a minute'; 'unknown' for None."""
    if seconds is None:
        return "unknown"
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute"
    hours, minutes = divmod(minutes, 60)
    return "about " + (f"{hours} h {minutes} min" if hours else f"{minutes} min")
