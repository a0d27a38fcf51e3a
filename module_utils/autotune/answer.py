"""Autotune's answer written back where the next deploy reads it: host_vars/<host>/autotune.yml
in the inventory the host came from (the lab's copy: its overrides' place). It sets the deploy's
own variables to the pick of one band (kimi_server_config, kimi_mem_fraction_static,
kimi_chunked_prefill_size, kimi_server_extra_args, kimi_autotune_environment) and keeps every
band's pick, runner-up, margin and the search's figures under kimi_autotune, which a rerun of
autotune starts from."""

from __future__ import annotations

import os

from ansible.module_utils.autotune.space import launch_settings
from ansible.module_utils.host.helpers import atomic_write

ANSWER_FILE = "autotune.yml"
# The deploy variables a launch's settings become.
SETTING_VARIABLES = {
    "mem_fraction_static": "kimi_mem_fraction_static",
    "chunked_prefill_size": "kimi_chunked_prefill_size",
}


class AnswerError(ValueError):
    """An answer that cannot be written: which path or band, and why."""


def _entry(pick: dict | None) -> dict | None:
    if not pick:
        return None
    return {
        "knobs": pick["knobs"],
        "goodput_requests_per_s": pick["goodput"],
        "interval": [pick["low"], pick["high"]],
        "rung": pick["rung"],
        "requests": pick.get("requests"),
    }


def answer_document(found: dict, context: dict, contract: dict, base_config: str) -> dict:
    """The file's variables: the deploy's own settings from the pick of context["band"] (the
    band the host serves), and kimi_autotune with every band. AnswerError when that band has
    no pick (nothing met a measurement there)."""
    band = str(context["band"])
    if band not in found["bands"]:
        raise AnswerError(
            f"autotune_deploy_band {band} is not one of the searched bands "
            f"({', '.join(found['bands'])}). Fix: one of them."
        )
    bands = {}
    for name, result in found["bands"].items():
        bands[name] = {
            "pick": _entry(result["best"]),
            "runner_up": _entry(result["runner_up"]),
            "margin": result["margin"],
        }
    pick = found["bands"][band]["best"]
    if pick is None:
        raise AnswerError(
            f"no candidate was measured at band {band} (every trial failed or none ran within "
            "the budget): nothing to write. Fix: a larger autotune_budget_minutes or a space "
            "whose candidates start."
        )
    launch = launch_settings(pick["knobs"], contract, base_config)
    document = {
        "kimi_autotune": {
            **context,
            "band": int(band),
            "pick": pick["knobs"],
            "bands": bands,
            "search": {k: v for k, v in found.items() if k != "bands"},
        },
        "kimi_server_config": launch["config"],
        "kimi_server_extra_args": launch["extra_args"],
        "kimi_autotune_environment": launch["environment"],
    }
    for setting, value in launch["settings"].items():
        document[SETTING_VARIABLES[setting]] = value
    return document


HEADER = """\
# Written by autotune.yml: the best setting per concurrency band under its SLO, measured on this
# host (kimi_autotune.run_id). The deploy's variables below are the pick of band {band}
# (autotune_deploy_band); kimi_autotune keeps every band's pick, runner-up and margin, and a
# rerun of autotune with the same inputs starts from the pick. Delete this file to deploy the
# kit's defaults again; -e on the command line still wins over it.
"""


def write_answer(inventory_dir: str, host: str, document: dict, check_mode: bool) -> dict:
    """host_vars/<host>/autotune.yml under the inventory folder, written atomically when its
    content changes; {path, changed}. The host name must stay one folder inside host_vars."""
    import yaml

    if not os.path.isdir(inventory_dir):
        raise AnswerError(f"the inventory folder {inventory_dir!r:.200} does not exist")
    if not host or host in (".", "..") or "/" in host or "\x00" in host:
        raise AnswerError(f"host name {host!r:.80} cannot name a host_vars folder")
    folder = os.path.join(inventory_dir, "host_vars", host)
    path = os.path.join(folder, ANSWER_FILE)
    for place in (os.path.join(inventory_dir, "host_vars"), folder, path):
        if os.path.islink(place):
            raise AnswerError(f"{place} is a symbolic link: autotune writes no file through one")
    text = HEADER.format(band=document["kimi_autotune"]["band"]) + yaml.safe_dump(
        document, sort_keys=False, default_flow_style=False, width=100
    )
    try:
        with open(path, encoding="utf-8") as handle:
            changed = handle.read() != text
    except FileNotFoundError:
        changed = True
    if changed and not check_mode:
        atomic_write(path, text, 0o644)
    return {"path": path, "changed": changed}
