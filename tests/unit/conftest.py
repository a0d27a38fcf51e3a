"""Unit-test fixtures: each distinct figure drawn once per test session."""

from __future__ import annotations

import copy
import pickle

import pytest


@pytest.fixture(scope="session", autouse=True)
def figures_drawn_once():
    """plots.draw, each figure drawn once per distinct input (the drawing function, its
    arguments and the label, which are all a figure is made of) for the session's unit tests.
    Drawing is most of a report's CPU, and many tests report on the same results tree to check
    different things: a second report of it gets the first one's figures, which are the same
    bytes. An input pickle cannot hold is drawn every time. Tests marked `fresh_plots` (one
    that compares two drawings, say) draw every figure themselves."""
    from analysis import plots

    real = plots.draw
    drawn: dict[tuple, object] = {}

    def draw(function, args, label=""):
        try:
            key = (function, pickle.dumps((args, label)))
        except Exception:  # not picklable: drawn as without the cache
            return real(function, args, label)
        if key not in drawn:
            drawn[key] = real(function, args, label)
        # A copy: a caller that retitles its figure or edits its details must not change the
        # kept one.
        return copy.deepcopy(drawn[key])

    plots.draw = draw
    yield real
    plots.draw = real


@pytest.fixture(autouse=True)
def fresh_plots(request, figures_drawn_once, monkeypatch):
    """`fresh_plots`: every figure drawn anew; `fresh_plots("name", ...)`: the figures of those
    drawing functions anew, the others as the session drew them."""
    marker = request.node.get_closest_marker("fresh_plots")
    if marker is None:
        return
    from analysis import plots

    if not marker.args:
        monkeypatch.setattr(plots, "draw", figures_drawn_once)
        return
    cached = plots.draw

    def draw(function, args, label=""):
        chosen = function.__name__ in marker.args
        return (figures_drawn_once if chosen else cached)(function, args, label)

    monkeypatch.setattr(plots, "draw", draw)
