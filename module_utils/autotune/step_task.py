"""The autotune_step task: one step of the search, run inside ansible-playbook's worker
(action_plugins/kit_in_process.py) on the controller, with the search's state in a JSON file of
the run's results (results/<run>/<host>/autotune/search.json):

- start: check the space (module_utils/autotune/space.py, against the pinned parser) and the
  SLO before anything is contacted, and write the state;
- next: the next trial (its knobs and the launch they make), or done;
- record: score the trial's level files on the controller (score.py) and take the outcome;
- finish: the answer (search.py), written back into the inventory (answer.py).
"""

from __future__ import annotations

import os
import time

from ansible.module_utils.autotune import answer as answers
from ansible.module_utils.autotune import page, search
from ansible.module_utils.autotune.score import ScoreError, trial_scores
from ansible.module_utils.autotune.space import SpaceError, launch_settings, parse_space
from ansible.module_utils.contract.slo import SloError, parse_slo
from ansible.module_utils.host.helpers import atomic_write, read_json_bounded, write_json_atomic
from ansible.module_utils.host.in_process import TaskError
from ansible.module_utils.plan.sglang_args import load_contract

MAX_STATE_BYTES = 32 << 20
SPEC = {
    "action": {"type": "str", "required": True, "choices": ["start", "next", "record", "finish"]},
    "state_file": {"type": "path", "required": True},
    "space": {"type": "dict"},
    "slo": {"type": "str"},
    "bands": {"type": "list", "elements": "int"},
    "budget_minutes": {"type": "float"},
    "rungs": {"type": "list", "elements": "int", "default": list(search.DEFAULT_RUNGS)},
    "configs": {"type": "list", "elements": "str", "default": []},
    "base_config": {"type": "str"},
    "contract": {"type": "path"},
    "contract_overlay": {"type": "path"},
    "plan_file": {"type": "path"},
    "warm": {"type": "dict", "default": {}},
    "trial_id": {"type": "str"},
    "trial_dir": {"type": "path"},
    "trial_status": {"type": "str", "choices": ["ok", "failed"]},
    "trial_error": {"type": "str", "default": ""},
    "inventory_dir": {"type": "path"},
    "host": {"type": "str"},
    "deploy_band": {"type": "int"},
    "context": {"type": "dict", "default": {}},
}
RULES = {
    "required_if": [
        ("action", "start", ("space", "slo", "bands", "budget_minutes", "configs", "contract")),
        ("action", "start", ("base_config",)),
        ("action", "next", ("contract",)),
        ("action", "record", ("trial_id", "trial_dir", "trial_status")),
        ("action", "finish", ("inventory_dir", "host", "deploy_band", "contract")),
    ]
}


def _contract(params: dict) -> dict:
    try:
        return load_contract(params["contract"], params.get("contract_overlay"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"autotune_step: the runtime's contract cannot be read: {exc}") from None


def _read_state(path: str) -> dict:
    try:
        state = read_json_bounded(path, MAX_STATE_BYTES)
    except ValueError as exc:
        raise TaskError(
            f"autotune_step: the search state cannot be read: {exc}. Fix: start the search "
            "again (autotune.yml)."
        ) from None
    if not isinstance(state, dict) or state.get("version") != search.STATE_VERSION:
        raise TaskError(f"autotune_step: {path} is not a search state of this kit")
    return state


def _read_plan(path: str | None):
    """plan.yml's plan.json of the host, for the speed model's ranking; None without one (or
    with one that cannot be read): the search then keeps the space's order."""
    try:
        return read_json_bounded(path, MAX_STATE_BYTES) if path else None
    except ValueError:
        return None


def _start(params: dict) -> dict:
    contract = _contract(params)
    try:
        slo = parse_slo(params["slo"])
        parsed = parse_space(params["space"], contract, params["configs"])
        if params["base_config"] not in params["configs"]:
            raise SpaceError(
                f"the deploy's config {params['base_config']!r} is not among {params['configs']}"
            )
        warm = params["warm"].get("pick") if isinstance(params["warm"], dict) else None
        state = search.new_search(
            parsed,
            bands=params["bands"],
            slo=slo,
            budget_s=params["budget_minutes"] * 60,
            started=time.time(),
            rungs=params["rungs"],
            predicted=search.predictions(_read_plan(params.get("plan_file")), params["bands"]),
            warm_key=search.candidate_key(warm) if isinstance(warm, dict) else None,
        )
    except (SpaceError, SloError, search.SearchError) as exc:
        raise TaskError(f"autotune: {exc}") from None
    state["base_config"] = params["base_config"]
    write_json_atomic(params["state_file"], state)
    ranked = sum(entry["predicted"] is not None for entry in state["candidates"])
    return {
        "changed": True,
        "candidates": len(state["candidates"]),
        "predicted": ranked,
        "first": state["candidates"][0]["key"],
        # The trial loop's bound: every trial the search can ask for, and the step that ends it.
        "trial_bound": search.trial_bound(
            len(state["candidates"]), len(state["bands"]), len(state["rungs"]), state["eta"]
        )
        + 1,
        "space": parsed,
    }


def act(params: dict, check_mode: bool) -> dict:
    """The step's result; TaskError naming what is wrong."""
    action, path = params["action"], params["state_file"]
    if action == "start":
        if check_mode:
            try:
                parse_space(params["space"] or {}, _contract(params), params["configs"])
            except SpaceError as exc:
                raise TaskError(f"autotune: {exc}") from None
            return {"changed": False}
        return _start(params)
    state = _read_state(path)
    now = time.time()
    try:
        if action == "next":
            trial = search.next_trial(state, now)
            write_json_atomic(path, state)
            if trial is None:
                return {"changed": False, "done": True, "stop": state["stop"]}
            launch = launch_settings(trial["knobs"], _contract(params), state["base_config"])
            return {"changed": False, "done": False, "trial": {**trial, "launch": launch}}
        if action == "record":
            scores = {}
            if params["trial_status"] == "ok":
                try:
                    scores = trial_scores(params["trial_dir"], state["bands"], state["slo"])
                except ScoreError as exc:
                    params["trial_status"], params["trial_error"] = "failed", str(exc)
            outcome = {
                "status": params["trial_status"],
                "error": params["trial_error"],
                "scores": {str(band): value for band, value in scores.items()},
            }
            trial = search.record_trial(state, params["trial_id"], outcome, now)
            write_json_atomic(path, state)
            return {"changed": False, "trial": trial}
        found = search.answer(state)
        context = {**params["context"], "band": params["deploy_band"]}
        # The page first: a search that found nothing to write back still shows its path.
        page_path = os.path.join(os.path.dirname(path), "search.md")
        if not check_mode:
            atomic_write(page_path, page.render(state, found, {**context, "host": params["host"]}))
        document = answers.answer_document(found, context, _contract(params), state["base_config"])
        written = answers.write_answer(
            params["inventory_dir"], params["host"], document, check_mode
        )
        return {**written, "page": page_path, "answer": found, "document": document}
    except (search.SearchError, answers.AnswerError, SpaceError) as exc:
        raise TaskError(f"autotune: {exc}") from None
