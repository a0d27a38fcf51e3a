"""The kit's settings as the roles' argument specs declare them, checked on the controller
before any host is contacted (action_plugins/kimi_settings_check.py).

The specs (roles/<role>/meta/argument_specs.yml) are the one source: each option's type,
elements and choices, and for numbers its range, the last sentence of its description,
"Range 1 to 4096." (inclusive; "above 0" or "below 1" for an open end), so that
ansible-doc shows users the same bounds this check holds them to.

The check is stricter than Ansible's own validation at a role's start, which converts what it
can: there `-e benchmark_concurrency=1,4,16` becomes a list, while the role's templates still
read the string and iterate its characters. Here a list or dict must be one; a scalar given as
text (every `-e key=value` is) must read as its type whole.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping

# Variable names that belong to the kit: a name with one of these prefixes that the kit never
# reads is a misspelling (kimi_weigths_dir) that would otherwise be silently ignored.
KIT_PREFIXES = (
    "kimi_",
    "autotune_",
    "benchmark_",
    "canary_",
    "diagnose_",
    "plan_",
    "preflight_",
    "runtime_",
    "server_",
    "tuning_",
    "weights_",
)
RANGE = re.compile(
    r"Range (?P<low_open>above )?(?P<low>-?[0-9][0-9.e+-]*) to "
    r"(?P<high_open>below )?(?P<high>-?[0-9][0-9.e+-]*)\.\s*$"
)
# Ansible's boolean spellings (module_utils.parsing.convert_bool), as text or number.
TRUE_WORDS = frozenset(("y", "yes", "on", "1", "true", "t"))
FALSE_WORDS = frozenset(("n", "no", "off", "0", "false", "f"))
INTEGER_TEXT = re.compile(r"^[+-]?[0-9]+$")
SHOWN_CHARS = 120


class SpecError(Exception):
    """An argument spec the check cannot read: a defect of the kit, not of the user's input."""


def description_text(option: Mapping) -> str:
    text = option.get("description", "")
    return " ".join(text) if isinstance(text, list) else str(text)


def option_range(name: str, option: Mapping):
    """(low, low_open, high, high_open) from the description's closing "Range:" sentence, or
    None for an option that is not a number (or a list of numbers)."""
    kind = option.get("type", "str")
    numeric = kind in ("int", "float") or (
        kind == "list" and option.get("elements") in ("int", "float")
    )
    if not numeric:
        return None
    found = RANGE.search(description_text(option))
    if not found:
        raise SpecError(
            f"the argument spec of {name} gives no range: its description must end with "
            '"Range <low> to <high>."'
        )
    try:
        low, high = float(found["low"]), float(found["high"])
    except ValueError as error:
        raise SpecError(f"the range of {name} does not read as numbers: {error}") from None
    if not low <= high:
        raise SpecError(f"the range of {name} is empty ({low} to {high})")
    return low, bool(found["low_open"]), high, bool(found["high_open"])


def role_options(specs: Mapping[str, Mapping]) -> dict[str, dict]:
    """{option: spec} of every entry point of the roles; specs is {role: argument_specs.yml}."""
    options: dict[str, dict] = {}
    for role, document in specs.items():
        for entry in ((document or {}).get("argument_specs") or {}).values():
            for name, option in ((entry or {}).get("options") or {}).items():
                option = dict(option or {})
                option["role"] = role
                option_range(name, option)
                options.setdefault(name, option)
    return options


def kind_word(value) -> str:
    """What a value is, in a user's words (Ansible's tagged types carry their own names)."""
    for kinds, word in (
        (bool, "true or false"),
        (str, "text"),
        (int, "an integer"),
        (float, "a number"),
        (Mapping, "a mapping"),
        (list, "a list"),
    ):
        if isinstance(value, kinds):
            return word
    return type(value).__name__


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _bool_reads(value) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, int) and value in (0, 1):
        return True
    return isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS


def _number(value, kind: str):
    """value as an int or float of that kind, or None where it does not read as one whole."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if kind == "int":
            return int(text) if INTEGER_TEXT.match(text) else None
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    if kind == "int":
        return value if isinstance(value, int) else None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


def _in_range(number, bounds) -> bool:
    low, low_open, high, high_open = bounds
    above = number > low if low_open else number >= low
    below = number < high if high_open else number <= high
    return above and below


def range_text(bounds) -> str:
    """'from 1 to 4096', 'above 0 and below 1', as a user reads a range."""
    low, low_open, high, high_open = bounds

    def figure(value):
        return f"{value:.0f}" if value == int(value) else f"{value:g}"

    if not low_open and not high_open:
        return f"from {figure(low)} to {figure(high)}"
    lower = f"above {figure(low)}" if low_open else f"at least {figure(low)}"
    upper = f"below {figure(high)}" if high_open else f"at most {figure(high)}"
    return f"{lower} and {upper}"


def _scalar_problem(value, kind: str, bounds, choices) -> str | None:
    """What is wrong with one scalar, as the "needed" half of a message, or None."""
    if kind in ("int", "float"):
        number = _number(value, kind)
        noun = "an integer" if kind == "int" else "a number"
        if number is None or not _in_range(number, bounds):
            return f"{noun} {range_text(bounds)}"
        return None
    if kind == "bool":
        return None if _bool_reads(value) else "true or false"
    if kind in ("str", "path"):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return "text"
        if choices is not None and str(value) not in {str(choice) for choice in choices}:
            return "one of " + ", ".join(str(choice) for choice in choices)
        return None
    return None


def option_problem(option: Mapping, value) -> tuple[str, str] | None:
    """(what the option needs, what in the value is not that) or None when the value fits.
    Lists and dicts must be real ones: a string there would reach the role's templates as
    characters."""
    kind = option.get("type", "str")
    if value is None:
        return ("a value", "it is null") if option.get("required") else None
    bounds = option_range("", option) if kind in ("int", "float", "list") else None
    choices = option.get("choices")
    if kind == "list":
        elements = option.get("elements")
        noun = {"int": "integers", "float": "numbers", "str": "texts"}.get(elements, "items")
        whole = f"a list of {noun}" + (f" {range_text(bounds)}" if bounds else "")
        if not isinstance(value, list):
            return whole, f"{kind_word(value)}, not a list"
        for item in value:
            if elements and _scalar_problem(item, elements, bounds, choices):
                return whole, f"item {shown(item)} is not"
        return None
    if kind == "dict":
        return None if isinstance(value, Mapping) else ("a mapping (key: value)", "")
    if kind == "raw":
        return None
    needed = _scalar_problem(value, kind, bounds, choices)
    return (needed, "") if needed else None


def is_kit_name(name: str) -> bool:
    return name.startswith(KIT_PREFIXES)


def closest(name: str, known) -> str | None:
    """The known name a misspelling most likely meant: same prefix first, then any."""
    known = sorted(known)
    prefix = name.split("_", 1)[0] + "_"
    for pool in ([k for k in known if k.startswith(prefix)], known):
        found = difflib.get_close_matches(name, pool, n=1, cutoff=0.75)
        if found:
            return found[0]
    return None


NAME = re.compile(r"\b((?:" + "|".join(KIT_PREFIXES) + r")[a-z0-9_]*[a-z0-9])\b")


def names_in(document, found: set[str]) -> set[str]:
    """Every kit-prefixed name a loaded YAML document holds, in its keys and its texts (the
    Jinja that reads a variable), comments excluded: they are not read by the kit."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, value in item.items():
                if isinstance(key, str):
                    found.update(NAME.findall(key))
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            found.update(NAME.findall(item))
    return found


def unknown_names(given, known) -> list[tuple[str, str | None]]:
    """(name, closest known name) for each kit-prefixed name given that the kit never reads."""
    known = set(known)
    return [
        (name, closest(name, known))
        for name in sorted(given)
        if is_kit_name(name) and name not in known
    ]
