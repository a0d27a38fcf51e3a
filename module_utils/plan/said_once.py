"""A warning many launches share, said once: plan.md and plan.yml's output name every launch
it concerns on one line instead of repeating the text per launch (a DDTree sweep gives the same
context length warning for each budget)."""

from __future__ import annotations


def said_once(entries, text_key: str, name_key: str = "name") -> list[str]:
    """'name, name: text' per distinct non-empty text of entries[*][text_key] (a dotted key
    reads nested mappings: role.warning), in the order the texts first appear, names in theirs.
    Entries that are not mappings are refused."""
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"said_once needs a list of mappings, got {type(entries).__name__}")
    names_by_text: dict[str, list[str]] = {}
    for entry in entries:
        text = entry
        for part in text_key.split("."):
            text = text.get(part) if isinstance(text, dict) else None
        if text:
            names = names_by_text.setdefault(str(text), [])
            name = str(entry.get(name_key, "?"))
            if name not in names:
                names.append(name)
    return [f"{', '.join(names)}: {text}" for text, names in names_by_text.items()]
