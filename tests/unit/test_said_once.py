"""A warning many launches share is said once, naming them all (module_utils/plan/said_once.py)."""

from __future__ import annotations

import pytest
from ansible.module_utils.plan.said_once import said_once


def test_each_text_once_with_its_names_in_the_order_they_came():
    entries = [
        {"name": "ar", "w": "pool A too small"},
        {"name": "dflash", "w": "pool B too small"},
        {"name": "ddtree-b16", "w": "pool B too small"},
        {"name": "ok", "w": None},
        {"name": "eagle3", "w": ""},
        {"name": "ddtree-b32", "w": "pool B too small"},
        {"name": "dflash", "w": "pool B too small"},
    ]
    assert said_once(entries, "w") == [
        "ar: pool A too small",
        "dflash, ddtree-b16, ddtree-b32: pool B too small",
    ]
    assert said_once([], "w") == []
    assert said_once([{"w": "x"}], "w") == ["?: x"]


@pytest.mark.parametrize("entries", [None, "text", [["ar", "w"]], {"name": "ar"}])
def test_entries_that_are_not_a_list_of_mappings_are_refused(entries):
    with pytest.raises(ValueError, match="said_once needs a list of mappings"):
        said_once(entries, "w")
