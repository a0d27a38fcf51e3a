"""Lays the kit's modules out as a collection, the shape ansible-test's sanity checks need.

The kit keeps its modules in library/ and module_utils/ beside the playbooks (ansible.cfg points
Ansible there), while ansible-test works only inside ansible_collections/<namespace>/<name>/.
build() writes such a copy: plugins/modules from library/, plugins/module_utils from
module_utils/ and plugins/doc_fragments from doc_fragments/, with the imports and fragment
names rewritten to the collection's, a galaxy.yml, and tests/sanity/ignore-*.txt (kept here as
validate-modules-ignore-*.txt). The repository's files are never changed.

    python -m tests.sanity.collection DEST    # prints the collection's root
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "kimi"
NAME = "deploy_kit"
FQCN = f"{NAMESPACE}.{NAME}"
PACKAGE = f"ansible_collections.{NAMESPACE}.{NAME}.plugins"
# The version the collection copy claims; only ansible-test reads it.
VERSION = "0.1.0"
# ansible-core's own module_utils the kit imports from (basic, common.*) keep their names.
# The kit's stage packages (module_utils/<stage>/__init__.py); imports name them first.
KIT_UTILS = frozenset(path.parent.name for path in (REPO / "module_utils").glob("*/__init__.py"))
FRAGMENTS = frozenset(path.stem for path in (REPO / "doc_fragments").glob("*.py"))

# `from ansible.module_utils.X import ...` and `from ansible.module_utils import X, Y`.
_FROM_UTIL = re.compile(
    r"^([ \t]*)from ansible\.module_utils\.(\w+)((?:\.\w+)*) import ", re.MULTILINE
)
_FROM_UTILS = re.compile(
    r"^([ \t]*)from ansible\.module_utils import ([\w, ]+?)([ \t]*#.*)?$", re.MULTILINE
)
_IMPORT_UTIL = re.compile(r"^([ \t]*)import ansible\.module_utils\.(\w+)", re.MULTILINE)
# A fragment named in DOCUMENTATION's extends_documentation_fragment list.
_FRAGMENT = re.compile(r"^([ \t]*- )(\w+)[ \t]*$", re.MULTILINE)


class LayoutError(Exception):
    """The source tree holds something the rewrite cannot map onto the collection."""


def rewrite_imports(source: str, path: Path) -> str:
    """The kit's module_utils imports under the collection's package; Ansible's own unchanged."""

    def from_util(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in KIT_UTILS:
            return match.group(0)
        return f"{match.group(1)}from {PACKAGE}.module_utils.{name}{match.group(3)} import "

    def from_utils(match: re.Match[str]) -> str:
        # `import a, b as c`: the imported names are the first word of each part.
        names = {part.split()[0] for part in match.group(2).split(",")}
        if not names & KIT_UTILS:
            return match.group(0)
        if not names <= KIT_UTILS:
            raise LayoutError(f"{path}: one import mixes the kit's and Ansible's module_utils")
        rest = match.group(2) + (match.group(3) or "")
        return f"{match.group(1)}from {PACKAGE}.module_utils import {rest}"

    def import_util(match: re.Match[str]) -> str:
        if match.group(2) in KIT_UTILS:
            raise LayoutError(f"{path}: `import ansible.module_utils.X` (use from-imports)")
        return match.group(0)

    source = _FROM_UTIL.sub(from_util, source)
    source = _FROM_UTILS.sub(from_utils, source)
    return _IMPORT_UTIL.sub(import_util, source)


def rewrite_fragments(source: str) -> str:
    """Fragment names in extends_documentation_fragment become the collection's FQCNs."""
    marker = "extends_documentation_fragment:"
    start = source.find(marker)
    if start < 0:
        return source
    head, tail = source[:start], source[start:]
    # The list ends at the next top-level key; only its items are renamed.
    block_end = re.search(r"^\S", tail[len(marker) + 1 :], re.MULTILINE)
    cut = len(tail) if block_end is None else len(marker) + 1 + block_end.start()

    def fqcn(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in FRAGMENTS:
            raise LayoutError(f"documentation fragment {name!r} is not in doc_fragments/")
        return f"{match.group(1)}{FQCN}.{name}"

    return head + _FRAGMENT.sub(fqcn, tail[:cut]) + tail[cut:]


def _copy_python(source_dir: Path, target_dir: Path, modules: bool) -> list[Path]:
    target_dir.mkdir(parents=True)
    written = []
    for path in sorted(source_dir.rglob("*.py")):
        if "__pycache__" in path.parts or path == source_dir / "__init__.py":
            continue  # module_utils/__init__.py is the controller's finder, never shipped
        text = rewrite_imports(path.read_text(encoding="utf-8"), path)
        if modules:
            text = rewrite_fragments(text)
        target = target_dir / path.relative_to(source_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


GALAXY = f"""\
namespace: {NAMESPACE}
name: {NAME}
version: {VERSION}
readme: README.md
authors:
  - kimi-deploy-kit maintainers
description: The modules of the Kimi deploy kit, laid out for ansible-test
license:
  - Apache-2.0
"""

RUNTIME = """\
requires_ansible: ">=2.19.0"
"""


def build(dest: Path) -> Path:
    """Writes the collection under dest (which must not hold one) and returns its root."""
    root = dest / "ansible_collections" / NAMESPACE / NAME
    if root.exists():
        raise LayoutError(f"{root} already exists")
    plugins = root / "plugins"
    _copy_python(REPO / "library", plugins / "modules", modules=True)
    _copy_python(REPO / "module_utils", plugins / "module_utils", modules=False)
    _copy_python(REPO / "doc_fragments", plugins / "doc_fragments", modules=False)
    (root / "meta").mkdir()
    (root / "meta" / "runtime.yml").write_text(RUNTIME, encoding="utf-8")
    (root / "galaxy.yml").write_text(GALAXY, encoding="utf-8")
    (root / "README.md").write_text(
        "A copy of the kit's modules for ansible-test (tests/sanity/collection.py).\n",
        encoding="utf-8",
    )
    shutil.copy(REPO / "LICENSE", root / "LICENSE")
    sanity = root / "tests" / "sanity"
    sanity.mkdir(parents=True)
    # Kept under another name in the repository: ansible-lint reads tests/sanity/ignore-*.txt
    # of the kit itself and refuses some ignores that validate-modules allows.
    for ignore in sorted(Path(__file__).parent.glob("validate-modules-ignore-*.txt")):
        shutil.copy(ignore, sanity / ignore.name.removeprefix("validate-modules-"))
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.sanity.collection DEST")
    print(build(Path(sys.argv[1])))
