# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""kimi_settings_check: one host's settings checked on the controller before any play
connects to it (playbooks/tasks/settings_check.yml). Never contacts the host: it only reads
its variables, the roles' argument specs and defaults. The checks are
module_utils/contract/settings_host.py's; this gives them the variables as the roles would see
them (role defaults under the inventory and extra vars) and says where each was set."""

from __future__ import annotations

import os

from ansible._internal._datatag._tags import Origin
from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import action_loader
from ansible.template import trust_as_template

# The kit's module_utils, importable in ansible-playbook once kit_in_process is loaded.
action_loader.get("kit_in_process", class_only=True)

import yaml  # noqa: E402
from ansible.module_utils.contract import settings as spec  # noqa: E402
from ansible.module_utils.contract import settings_host as check  # noqa: E402
from ansible.module_utils.router.fleet import DEFAULTS as FLEET_SETTINGS  # noqa: E402

# The checkout this plugin belongs to, wherever ansible-playbook was started.
KIT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# Where the kit's own defaults live: a variable set there is not the user's.
KIT_OWNED = tuple(
    os.path.join(KIT_DIR, part) + os.sep for part in ("group_vars", "roles", "playbooks")
)
# The kit's files whose keys and Jinja name every variable it reads (comments excluded).
SCANNED = ("group_vars", "roles", "playbooks")
_cache: dict = {}
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text):
    """The kit's own YAML, read fast: the C loader where PyYAML has it, safe either way."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader, C or Python


def _role_specs() -> dict:
    if "options" not in _cache:
        roles_dir = os.path.join(KIT_DIR, "roles")
        specs = {}
        for role in sorted(os.listdir(roles_dir)):
            path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    specs[role] = _load_yaml(handle)
        try:
            _cache["options"] = spec.role_options(specs)
        except spec.SpecError as error:
            raise AnsibleActionFail(f"kimi_settings_check: {error}") from None
    return _cache["options"]


def _group_vars_names() -> set[str]:
    """The variables the kit's group_vars set (a user's override hides their origin there)."""
    if "group_vars" not in _cache:
        names: set[str] = set()
        for folder, _dirs, files in os.walk(os.path.join(KIT_DIR, "group_vars")):
            for name in files:
                if name.endswith((".yml", ".yaml")):
                    with open(os.path.join(folder, name), encoding="utf-8") as handle:
                        names.update(_load_yaml(handle) or {})
        _cache["group_vars"] = names
    return _cache["group_vars"]


def _scanned_names() -> set[str]:
    """Every kit-prefixed name in the kit's YAML and templates: asked only when a name is not
    among the options, the role defaults and group_vars (a misspelling, or one read only by a
    playbook, such as kimi_deploy_serial)."""
    if "scanned" not in _cache:
        found: set[str] = set()
        roots = [os.path.join(KIT_DIR, part) for part in SCANNED]
        files = [
            os.path.join(KIT_DIR, name) for name in os.listdir(KIT_DIR) if name.endswith(".yml")
        ]
        for root in roots:
            for folder, _dirs, names in os.walk(root):
                files += [os.path.join(folder, name) for name in names]
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            if path.endswith((".yml", ".yaml")):
                try:
                    spec.names_in(_load_yaml(text), found)
                except yaml.YAMLError:
                    found.update(spec.NAME.findall(text))
            elif path.endswith(".j2"):
                found.update(spec.NAME.findall(text))
        _cache["scanned"] = found
    return _cache["scanned"]


def _role_defaults(loader) -> dict:
    """Every role's defaults, merged, as Ansible loads them (trusted as templates, each value
    tagged with its file, so that _where knows them for the kit's)."""
    if "defaults" not in _cache:
        merged: dict = {}
        for role in _role_specs_roles():
            path = os.path.join(KIT_DIR, "roles", role, "defaults", "main.yml")
            if os.path.isfile(path):
                merged.update(loader.load_from_file(path, trusted_as_template=True) or {})
        _cache["defaults"] = merged
    return _cache["defaults"]


def warm() -> None:
    """What every host's check reads the same, read once in ansible-playbook itself before it
    forks the task's workers (callback_plugins/kimi_progress.py calls this at the task's
    start): each worker would otherwise parse the specs and the nine defaults files anew, and
    a run checks every host."""
    from ansible.parsing.dataloader import DataLoader

    _role_specs()
    _group_vars_names()
    _role_defaults(DataLoader())


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("hf_token", "serving"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        task_vars = task_vars or {}
        root = _root_problem(task_vars)
        if root:
            result.update(problems=[check.problem_text(root)])
            return result
        options = _role_specs()
        defaults = _role_defaults(self._loader)
        variables = {**defaults, **task_vars}
        templar = self._templar.copy_with_new_env(available_variables=variables)

        def value(name):
            if name not in variables:
                raise KeyError(name)
            return templar.template(variables[name])

        def origin(name):
            return _where(variables.get(name))

        def raw(name):
            item = variables.get(name)
            return str(item) if isinstance(item, str) else None

        problems = []
        profile = None
        if boolean(self._task.args.get("serving", True), strict=False):
            profile = check.profile_problem(value, task_vars.get("group_names", []))
        if profile:
            problems.append(profile)
        given = [name for name in task_vars if spec.is_kit_name(name) and origin(name) is not None]
        # A fleet's settings are read from its kimi_router_* group's vars, their defaults in
        # module_utils/router/fleet.py (not group_vars/all, whose values would beat the group's).
        known = set(options) | set(defaults) | _group_vars_names() | set(_foreign(value))
        known |= set(FLEET_SETTINGS)
        if any(name not in known for name in given):
            known |= _scanned_names()
        problems += check.unknown_problems(given, known, origin)
        if not profile:
            problems += check.option_problems(options, value, origin, raw, known)
            if self._task.args.get("hf_token"):
                gated = _gated_repos(templar, value)
                result["gated_repos"] = gated
                token = check.token_problem(
                    value("kimi_hf_token"), gated, value("kimi_repos_requested")
                )
                problems += [token] if token else []
        result.update(problems=[check.problem_text(problem) for problem in problems])
        return result


def _role_specs_roles():
    return sorted({option["role"] for option in _role_specs().values()})


def _foreign(value) -> list[str]:
    try:
        names = value("kimi_foreign_variables")
    except KeyError:
        return []
    return [str(name) for name in names] if isinstance(names, list) else []


def _where(item) -> str | None:
    """Where the user set a variable (file:line, or -e), or None where the kit's files did."""
    tag = Origin.get_tag(item)
    if tag is None:
        return None
    if tag.path is None:
        return "-e" if "-e" in (tag.description or "") else (tag.description or None)
    if _real_path(tag.path).startswith(KIT_OWNED):
        return None
    shown = (
        os.path.relpath(tag.path, KIT_DIR) if tag.path.startswith(KIT_DIR + os.sep) else tag.path
    )
    return f"{shown}:{tag.line_num}" if tag.line_num else shown


def _real_path(path: str) -> str:
    """realpath, once per file: every variable of a file carries the file's origin."""
    known = _cache.setdefault("real_paths", {})
    if path not in known:
        known[path] = os.path.realpath(path)
    return known[path]


def _root_problem(task_vars) -> dict | None:
    config = task_vars.get("ansible_config_file")
    wanted = os.path.join(KIT_DIR, "ansible.cfg")
    if config and os.path.realpath(config) == wanted:
        return None
    return {
        "name": "ansible_config_file",
        "found": f"ansible-playbook started in {os.getcwd()}, where it read "
        + (f"the configuration {config}" if config else "no ansible.cfg")
        + ", not the kit's (its callbacks, interpreter and SSH settings)",
        "needed": f"the kit's repository root, {KIT_DIR}, as the working folder",
        "fix": f"cd {KIT_DIR} and run the same ansible-playbook command from there "
        "(inventory paths relative to it)",
    }


def _gated_repos(templar, value) -> list[str]:
    """The gated repositories the serving configs need: the token's problem here, and the
    hub's question of its approval in settings_check.yml (the result's gated_repos)."""
    needed = templar.evaluate_expression(
        trust_as_template(
            "kimi_serving_configs | kimi_needed_repos(kimi_serving_config_definitions)"
        )
    )
    model = value("kimi_model_data")
    gated = {"target": bool(model.get("target", {}).get("gated"))}
    gated.update(
        {key: bool(drafter.get("gated")) for key, drafter in model.get("drafters", {}).items()}
    )
    return check.gated_needed(needed, gated)
