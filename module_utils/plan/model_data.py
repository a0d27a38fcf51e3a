"""A target model as data: models/<name>/model.yml, read and checked before anything uses it.

One folder per model holds what the kit used to assume for Kimi K2.6: the hub repositories of
the target and its drafters, the config.json files capacity planning reads, the default tensor
parallel size, the serving configs with their flags, the parsers, per hardware profile the
attention backends and memory fraction, and the names of published reference figures.
group_vars/all derives every model variable from it (kimi_model picks the folder), so inventory
and extra vars still win over the model's values.

A model.yml is input like any other: the model name must be a plain folder name, every path it
names must stay inside its folder, and every field is type-checked and bounded, so that a typo
fails here naming the file, the field, what was found and what is needed, instead of somewhere
in a launch command.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ansible.module_utils.contract.names import MAX_BUDGET, MAX_TP

MODEL_FILE = "model.yml"
MAX_MODEL_FILE_BYTES = 1 << 20
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
KEY = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
CONFIG_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,63}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
REVISION = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]{0,254}$")
WORD = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ATTENTION = ("pure_attention", "hybrid")
RUNTIMES = ("release", "git")
BACKEND_KEYS = ("target_attention_backend", "draft_attention_backend", "tree_attention_backend")
DEFINITION_KEYS = frozenset(
    ("drafter", "tree", "runtime", "args", "draft_backend_flag", "budget_flag", "control_for", "tp")
)
MAX_ITEMS = 256
MAX_GIB = 1 << 20  # a repository of a PiB is a typo


class ModelDataError(Exception):
    pass


def known_models(models_dir) -> list[str]:
    """Names of the folders under models_dir that hold a model.yml."""
    try:
        entries = sorted(os.listdir(models_dir))
    except OSError:
        return []
    return [
        name
        for name in entries
        if NAME.match(name) and os.path.isfile(os.path.join(models_dir, name, MODEL_FILE))
    ]


def _fix(models_dir) -> str:
    names = known_models(models_dir)
    known = ", ".join(names) if names else "none"
    return f"Known models (folders of {models_dir} with a {MODEL_FILE}): {known}."


def model_folder(models_dir, name) -> Path:
    """models_dir/name, refused unless name is a plain folder name that holds a model.yml."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        raise ModelDataError(
            f"kimi_model is {name!r}; needed the name of a folder under {models_dir} "
            f"(lower-case letters, digits, '.', '_', '-'). {_fix(models_dir)} "
            "Fix: -e kimi_model=<one of them>."
        )
    folder = Path(models_dir) / name
    if not (folder / MODEL_FILE).is_file():
        raise ModelDataError(
            f"kimi_model is {name!r}, but {folder / MODEL_FILE} does not exist. "
            f"{_fix(models_dir)} Fix: -e kimi_model=<one of them>, or add the model's folder "
            "(models/README.md says what it holds)."
        )
    return folder


def load_model(models_dir, name, parse_yaml) -> dict:
    """The checked model data of models_dir/name. parse_yaml turns the file's text into data
    (yaml.safe_load, passed in so that this module needs only the standard library)."""
    folder = model_folder(models_dir, name)
    path = folder / MODEL_FILE
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_MODEL_FILE_BYTES + 1)
    except OSError as error:
        raise ModelDataError(f"cannot read {path}: {error.strerror or error}") from None
    if len(raw) > MAX_MODEL_FILE_BYTES:
        raise ModelDataError(f"{path} is over {MAX_MODEL_FILE_BYTES} bytes; a model.yml is small")
    try:
        data = parse_yaml(raw.decode("utf-8"))
    except Exception as error:
        raise ModelDataError(f"{path} is not valid YAML: {error}") from None
    return check_model(data, folder)


class _Reader:
    """Reads one mapping of the file and fails naming the file and the field."""

    def __init__(self, data, path: str, where: str):
        self.path, self.where = path, where
        if not isinstance(data, dict):
            self.fail(where or "the file", data, "a mapping")
        self.data = data

    def fail(self, field, found, needed):
        shown = repr(found)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise ModelDataError(f"{self.path}: {field} is {shown}; needed {needed}.")

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key, default=None):
        return self.data.get(key, default)

    def text(self, key, pattern: re.Pattern | None = None, needed: str = "", optional=False):
        value = self.data.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value or len(value) > 1024:
            self.fail(self.name(key), value, needed or "a non-empty string")
        if pattern is not None and not pattern.match(value):
            self.fail(self.name(key), value, needed or f"a string matching {pattern.pattern}")
        return value

    def integer(self, key, low: int, high: int, value=None):
        value = self.data.get(key) if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(self.name(key), value, f"an integer from {low} to {high}")
        return value

    def integers(self, key, low: int, high: int, optional=False) -> list[int] | None:
        value = self.data.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, list) or not 0 < len(value) <= MAX_ITEMS:
            self.fail(self.name(key), value, f"a list of 1 to {MAX_ITEMS} integers")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not low <= item <= high:
                self.fail(self.name(key), value, f"integers from {low} to {high}")
        if len(set(value)) != len(value):
            self.fail(self.name(key), value, "no value twice")
        return list(value)

    def words(self, key, pattern: re.Pattern, optional=False) -> list:
        value = self.data.get(key)
        if value is None and optional:
            return []
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            self.fail(self.name(key), value, f"a list of at most {MAX_ITEMS} names")
        for item in value:
            if not isinstance(item, str) or not pattern.match(item):
                self.fail(self.name(key), item, f"a name matching {pattern.pattern}")
        return list(value)

    def mapping(self, key) -> _Reader:
        return _Reader(self.data.get(key), self.path, self.name(key))


def _inside(folder: Path, reader: _Reader, key: str) -> str:
    """A config path of the model, relative to its folder and inside it once resolved."""
    value = reader.text(key)
    parts = Path(value).parts
    if os.path.isabs(value) or ".." in parts or "\\" in value or "\x00" in value:
        reader.fail(reader.name(key), value, "a path relative to the model's folder, inside it")
    resolved = (folder / value).resolve()
    if not resolved.is_relative_to(folder.resolve()):
        reader.fail(reader.name(key), value, "a path that stays inside the model's folder")
    if not resolved.is_file():
        reader.fail(reader.name(key), value, f"an existing file under {folder}")
    return value


def _repo(folder: Path, reader: _Reader) -> dict:
    return {
        "repo_id": reader.text("repo_id", REPO_ID, "a hub repository id, owner/name"),
        "revision": reader.text(
            "revision", REVISION, "a branch, tag or 40-character commit (not starting with '-')"
        ),
        "config": _inside(folder, reader, "config"),
        # Downloads need a token of an account with approved access: the controller's settings
        # check stops a run that has none before it connects (module_utils/contract/settings.py).
        "gated": _flag(reader, "gated"),
        # What the repository's files hold in all, as last seen on the hub: plan.md's download
        # size when the hub is not asked (marked as the model folder's). None where unknown.
        "download_gib": _gib(reader, "download_gib"),
    }


def _gib(reader: _Reader, key: str):
    value = reader.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_GIB:
        reader.fail(reader.name(key), value, f"a size in GiB above 0 and at most {MAX_GIB}")
    return float(value)


def _flag(reader: _Reader, key: str) -> bool:
    value = reader.get(key, False)
    if not isinstance(value, bool):
        reader.fail(reader.name(key), value, "true or false")
    return value


def _args(reader: _Reader, key: str) -> list[str]:
    value = reader.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        reader.fail(reader.name(key), value, f"a list of at most {MAX_ITEMS} arguments")
    args = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            reader.fail(reader.name(key), item, "a string or a number")
        text = str(item)
        if not text or len(text) > 4096 or "\n" in text or "\x00" in text:
            reader.fail(reader.name(key), item, "one line of at most 4096 characters")
        args.append(text)
    return args


def _definition(reader: _Reader, drafters: dict, names) -> dict:
    drafter = reader.get("drafter")
    if drafter is not None and drafter not in drafters:
        reader.fail(
            reader.name("drafter"), drafter, f"null or a drafter of the model: {sorted(drafters)}"
        )
    tree = reader.get("tree", False)
    if not isinstance(tree, bool):
        reader.fail(reader.name("tree"), tree, "true or false")
    runtime = reader.get("runtime", "release")
    if runtime not in RUNTIMES:
        reader.fail(reader.name("runtime"), runtime, f"one of {', '.join(RUNTIMES)}")
    definition = {
        "drafter": drafter,
        "tree": tree,
        "runtime": runtime,
        "args": _args(reader, "args"),
    }
    for key in ("draft_backend_flag", "budget_flag"):
        flag = reader.text(key, re.compile(r"^--[a-z0-9-]+$"), "a --flag", optional=True)
        if flag is not None:
            definition[key] = flag
    control = reader.get("control_for")
    if control is not None:
        if control not in names:
            reader.fail(
                reader.name("control_for"),
                control,
                f"a serving config of the model: {sorted(names)}",
            )
        definition["control_for"] = control
    tp = reader.integers("tp", 1, MAX_TP, optional=True)
    if tp is not None:
        definition["tp"] = tp
    unknown = set(reader.data) - DEFINITION_KEYS
    if unknown:
        reader.fail(
            reader.where, sorted(unknown), "only the keys of a serving config (models/README.md)"
        )
    return definition


def check_model(data, folder) -> dict:
    """The model data with every field checked; the result holds only known keys."""
    folder = Path(folder)
    top = _Reader(data, str(folder / MODEL_FILE), "")
    name = top.text("name", NAME, "the model's folder name")
    if name != folder.name:
        top.fail("name", name, f"the folder's name, {folder.name!r}")
    attention = top.get("attention")
    if attention not in ATTENTION:
        top.fail("attention", attention, f"one of {', '.join(ATTENTION)}")
    drafters_reader = top.mapping("drafters")
    drafters = {}
    for key in drafters_reader.data:
        if not isinstance(key, str) or not KEY.match(key) or key == "target":
            drafters_reader.fail(
                "drafters", key, "drafter keys of lower-case letters, digits and _ (not 'target')"
            )
        drafters[key] = _repo(folder, drafters_reader.mapping(key))
    definitions_reader = top.mapping("serving_config_definitions")
    names = list(definitions_reader.data)
    for config in names:
        if (
            not isinstance(config, str)
            or not CONFIG_NAME.match(config)
            or re.search(r"-(tp|b)[0-9]+$", config)
        ):
            definitions_reader.fail(
                "serving_config_definitions", config,
                "config names of lower-case letters, digits, '.' and '-', not ending in -tp<N> "
                "or -b<N> (the kit adds those when it expands TP sizes and budgets)",
            )  # fmt: skip
    definitions = {
        config: _definition(definitions_reader.mapping(config), drafters, names) for config in names
    }
    if not definitions:
        top.fail("serving_config_definitions", {}, "at least one serving config")
    serving_configs = top.words("serving_configs", CONFIG_NAME)
    unknown = [config for config in serving_configs if config not in definitions]
    if not serving_configs or unknown:
        top.fail(
            "serving_configs", serving_configs, f"a non-empty list of defined configs: {names}"
        )
    parsers = top.mapping("parsers")
    profiles_reader = top.mapping("profiles")
    profiles = {}
    for profile in profiles_reader.data:
        if not isinstance(profile, str) or not WORD.match(profile):
            profiles_reader.fail("profiles", profile, "hardware profile names")
        entry = profiles_reader.mapping(profile)
        checked = {key: entry.text(key, WORD, "an attention backend name") for key in BACKEND_KEYS}
        fraction = entry.get("mem_fraction_static")
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not 0 < fraction < 1
        ):
            entry.fail(entry.name("mem_fraction_static"), fraction, "a number between 0 and 1")
        checked["mem_fraction_static"] = fraction
        if "tp_size" in entry.data:
            checked["tp_size"] = entry.integer("tp_size", 1, MAX_TP)
        profiles[profile] = checked
    return {
        "name": name,
        "title": top.text("title"),
        "attention": attention,
        "target": _repo(folder, top.mapping("target")),
        "drafters": drafters,
        "tp_size": top.integer("tp_size", 1, MAX_TP),
        "serving_configs": serving_configs,
        "ddtree_budgets": top.integers("ddtree_budgets", 1, MAX_BUDGET),
        "parsers": {
            "tool_call": parsers.text("tool_call", WORD, "a parser name"),
            "reasoning": parsers.text("reasoning", WORD, "a parser name"),
        },
        "launch_args": _args(top, "launch_args"),
        "profiles": profiles,
        "serving_config_definitions": definitions,
        "references": top.words("references", re.compile(r"^[a-z0-9_]{1,64}$"), optional=True),
        "accuracy": _accuracy(top),
    }


def _accuracy(top: _Reader) -> dict:
    """The answer-scoring settings: the chat template switch that turns thinking off for scored
    prompt sets, and per prompt set the accuracy AR must reach, with where that floor comes from.
    Optional: a model without them is scored with its template's defaults and no floor."""
    if top.get("accuracy") is None:
        return {"chat_template_kwargs": {}, "floors": {}}
    reader = top.mapping("accuracy")
    kwargs_reader = (
        reader.mapping("chat_template_kwargs")
        if "chat_template_kwargs" in (reader.data)
        else _Reader({}, reader.path, reader.name("chat_template_kwargs"))
    )
    kwargs = {}
    for key, value in kwargs_reader.data.items():
        if not isinstance(key, str) or not KEY.match(key):
            kwargs_reader.fail(kwargs_reader.where, key, "template variable names (a-z, 0-9, _)")
        if not isinstance(value, (bool, int, float, str)) or (
            isinstance(value, str) and len(value) > 256
        ):
            kwargs_reader.fail(kwargs_reader.name(key), value, "a boolean, number or short string")
        kwargs[key] = value
    floors_reader = (
        reader.mapping("floors")
        if "floors" in reader.data
        else _Reader({}, reader.path, reader.name("floors"))
    )
    floors = {}
    for prompt_set in floors_reader.data:
        if not isinstance(prompt_set, str) or not WORD.match(prompt_set):
            floors_reader.fail(floors_reader.where, prompt_set, "prompt set names")
        entry = floors_reader.mapping(prompt_set)
        floor = entry.get("floor")
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor <= 1:
            entry.fail(entry.name("floor"), floor, "a share of right answers above 0, at most 1")
        floors[prompt_set] = {"floor": float(floor), "source": entry.text("source")}
    return {"chat_template_kwargs": kwargs, "floors": floors}


def serving_definitions(model: dict, budgets, tp_sizes=None) -> dict:
    """The model's serving configs as the serving renderer takes them: every config with a
    budget flag sweeps `budgets` (kimi_ddtree_budgets), and with `tp_sizes`
    (kimi_serving_tp_sizes) every config without its own `tp` list expands over those."""
    # Only each config's own mapping is copied (budgets and tp are set on it, nothing below):
    # under Ansible's templating `model` is a lazy mapping, which a deep copy templates whole
    # on every reference of kimi_serving_config_definitions (tens of ms each, per host-task).
    definitions = {
        name: dict(definition) for name, definition in model["serving_config_definitions"].items()
    }
    budgets = list(budgets or [])
    tp_sizes = list(tp_sizes or [])
    for config, definition in definitions.items():
        if definition.get("budget_flag"):
            _bounded(budgets, 1, MAX_BUDGET, "kimi_ddtree_budgets", f"the budgets of {config}")
            definition["budgets"] = budgets
        if tp_sizes and "tp" not in definition:
            _bounded(tp_sizes, 1, MAX_TP, "kimi_serving_tp_sizes", "tensor parallel sizes")
            definition["tp"] = tp_sizes
    return definitions


def _bounded(values: list, low: int, high: int, variable: str, what: str) -> None:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ModelDataError(
                f"{variable} is {values!r}; {what} must be integers from {low} to {high}. "
                f"Fix {variable} (inventory or -e)."
            )
    if len(set(values)) != len(values):
        raise ModelDataError(f"{variable} is {values!r}; needed no value twice. Fix {variable}.")


def config_paths(model: dict, models_dir) -> dict[str, str]:
    """{target: path, <drafter>: path} of the shipped config.json files (capacity planning)."""
    folder = Path(models_dir) / model["name"]
    paths = {"target": str(folder / model["target"]["config"])}
    for key, drafter in model["drafters"].items():
        paths[key] = str(folder / drafter["config"])
    return paths
