"""One host's settings checked on the controller before any connection: the hardware profile,
kit-prefixed names the kit never reads, every role option's type and range, and the HF token
where a gated repository is needed. action_plugins/kimi_settings_check.py gives it the host's
variables through three callables, so that this stays free of Ansible's templating:

- value(name): the variable templated as the roles would see it (KeyError when unset);
- origin(name): where the user set it ("inventory/lab/hosts.yml:7", "-e"), or None where the
  kit's own files set it (group_vars, role defaults);
- raw(name): the variable before templating (the kit's default expression), or None.

Each problem is a dict of found, needed and fix, with the variable it is about.
"""

from __future__ import annotations

import json
import re

from ansible.module_utils.contract import settings as spec
from ansible.module_utils.contract.profiles import PROFILES

REFERENCE = re.compile(r"\b([a-z][a-z0-9_]*)\b")
# How far a default expression is followed to find the setting the user changed:
# benchmark_concurrency -> kimi_benchmark_concurrency -> the inventory.
MAX_HOPS = 4
# The value of an option whose template fails (the error says why).
UNREADABLE = object()


def user_sources(name: str, origin, raw, known, hops: int = 0, seen=None) -> list[str]:
    """["kimi_ddtree_budgets (inventory/lab/group_vars/gpu_hosts.yml:4)", ...]: the settings the
    user made that the option's value comes from, following the kit's default expressions."""
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    where = origin(name)
    if where is not None:
        return [f"{name} ({where})"]
    expression = raw(name)
    if hops >= MAX_HOPS or not isinstance(expression, str):
        return []
    found = []
    for word in dict.fromkeys(REFERENCE.findall(expression)):
        if word != name and word in known:
            found += user_sources(word, origin, raw, known, hops + 1, seen)
    return found


def profile_problem(value, groups) -> dict | None:
    try:
        profile = value("kimi_profile")
    except KeyError:
        profile = None
    profiles = sorted(set(groups) & set(PROFILES))
    if profile in PROFILES and len(profiles) <= 1:
        return None
    if len(profiles) > 1:
        return {
            "name": "kimi_profile",
            "found": f"the host is in {len(profiles)} hardware profile groups "
            f"({', '.join(profiles)})",
            "needed": "the host in exactly one profile group, which sets its GPUs and backends",
            "fix": "keep the host under the one group of its hardware in the inventory",
        }
    found = (
        f"kimi_profile is {spec.shown(profile)}"
        if profile is not None
        else "the host is in none of the hardware profile groups (its groups: "
        + (", ".join(sorted(groups)) or "none")
        + ")"
    )
    return {
        "name": "kimi_profile",
        "found": found,
        "needed": "the host in exactly one profile group: " + ", ".join(PROFILES),
        "fix": "list the host under one of them in the inventory's hosts.yml (children: "
        "ct200: hosts: ...), or add a group_vars/<profile>.yml and an entry in "
        "group_vars/all/speed_hardware.json for new hardware",
    }


def unknown_problems(given, known, origin) -> list[dict]:
    problems = []
    for name, guess in spec.unknown_names(given, known):
        where = origin(name)
        problems.append(
            {
                "name": name,
                "found": f"{name}{f' ({where})' if where else ''}, a name with the kit's prefix "
                "that the kit never reads",
                "needed": "a setting the kit knows (ansible-doc -t role -r roles <role> lists "
                "each role's; group_vars/all/ holds the kimi_ ones)",
                "fix": (f"rename it to {guess}" if guess else "remove it or correct its spelling")
                + "; a variable of another tool that shares the prefix goes in "
                "kimi_foreign_variables",
            }
        )
    return problems


def _json_fix(name: str, value, needed: str) -> str | None:
    """For a list given as text on the command line (-e name=1,4,16): the JSON that gives a list."""
    if not isinstance(value, str) or not needed.startswith("a list"):
        return None
    items = []
    for part in value.split(","):
        part = part.strip()
        try:
            items.append(json.loads(part))
        except ValueError:
            items.append(part)
    return f"give it as JSON, where a list stays a list: -e '{json.dumps({name: items})}'"


def option_problems(options, value, origin, raw, known) -> list[dict]:
    """A problem per wrong setting: options whose values come from the same settings of the
    user (benchmark_concurrency and plan_speed_concurrency from one -e) are said once. Only
    options the user's settings reach are worked out: the kit's own defaults are held to the
    same specs by its tests, and templating every option of every role took most of a second
    per host."""
    problems, said = [], set()
    for name, option in sorted(options.items()):
        sources = user_sources(name, origin, raw, known)
        if not sources:
            continue
        try:
            current = value(name)
            wrong = spec.option_problem(option, current)
        except KeyError:
            continue
        except Exception as error:  # a template that fails: the role would fail on it too
            current = UNREADABLE
            wrong = ("a value the role can read", spec.shown(str(error).splitlines()[0]))
        if wrong is None:
            continue
        settings = tuple(source.split(" ", 1)[0] for source in sources)
        if settings in said:
            continue
        said.add(settings)
        needed, detail = wrong
        problems.append(
            _option_problem(name, option, current, needed, detail, sources, settings, origin)
        )
    return problems


def _option_problem(name, option, current, needed, detail, sources, settings, origin) -> dict:
    fix = None
    if origin(settings[0]) == "-e" and current is not UNREADABLE:
        fix = _json_fix(settings[0], current, needed)
    if fix is None:
        fix = f"set {' or '.join(settings)} to {needed}"
    own = origin(name)
    what = "cannot be worked out" if current is UNREADABLE else f"is {spec.shown(current)}"
    comes_from = "" if sources == [f"{name} ({own})"] else f", from {', '.join(sources)}"
    return {
        "name": name,
        "found": f"{name} {what}{f' ({own})' if own else ''}"
        + (f": {detail}" if detail else "")
        + comes_from,
        "needed": f"{needed} (roles/{option['role']}/meta/argument_specs.yml)",
        "fix": fix,
    }


def gated_needed(needed_repos, gated) -> list[str]:
    """The gated ones (gated: key -> bool, from models/*/model.yml) of the repositories the
    serving configs need, in their order: what the token must be approved for."""
    return [key for key in needed_repos if gated.get(key)]


def token_problem(token, missing, repos) -> dict | None:
    """The gated repositories the serving configs need (gated_needed), when no HF token is
    given."""
    if token or not missing:
        return None
    shown = ", ".join(f"{repos.get(key, {}).get('repo_id', key)} ({key})" for key in missing)
    return {
        "name": "kimi_hf_token",
        "found": f"no Hugging Face token, while the serving configs need the gated {shown}",
        "needed": "a token of an account with approved access to it",
        "fix": "request access on the repository's hub page, then export HF_TOKEN, run `hf auth "
        "login` (the token file), or set kimi_hf_token with ansible-vault; or leave the "
        "configs that need it out of kimi_serving_configs",
    }


def problem_text(problem: dict) -> str:
    return f"Found: {problem['found']}. Needed: {problem['needed']}. Fix: {problem['fix']}."
