"""The committed schema files and what writes each: `make schema` calls write()."""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.contract import level_schema, plan_schema, run_schema

# docs/schema/<name> -> the function that gives its text.
FILES = {
    "level.schema.json": level_schema.schema_json,
    "run.schema.json": run_schema.schema_json,
    "plan.schema.json": plan_schema.schema_json,
}


def write(folder: str) -> list[str]:
    """Writes every schema file into folder; returns the paths written."""
    written = []
    for name, text in FILES.items():
        path = Path(folder) / name
        path.write_text(text(), encoding="utf-8")
        written.append(str(path))
    return written
