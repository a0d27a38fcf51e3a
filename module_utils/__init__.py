"""The kit's module_utils/ on the controller, and on a machine without Ansible.

Importing this package makes each stage package (module_utils/<stage>/ with an __init__.py)
importable as ansible.module_utils.<stage>, the name Ansible ships it under to a host, so the
filters, the analysis, the tests and a program run bare import the same files under the same
names as the modules do. Nothing is added to ansible.module_utils.__path__ or to sys.path: one
finder on sys.meta_path answers for the kit's stage names only, after Ansible's own finders, so
Ansible's module_utils are never shadowed. Where Ansible is not installed (a GPU host running
`python3 module_utils/plan/speed_model.py`), empty stand-ins for the `ansible` and
`ansible.module_utils` packages hold the kit's stages and nothing else.

Standard library only. Never shipped to a host: AnsiballZ ships Ansible's own
ansible/module_utils/__init__.py and the stage packages a module imports.
"""

import importlib.machinery
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREFIX = "ansible.module_utils."
STAGES = frozenset(path.parent.name for path in HERE.glob("*/__init__.py"))


class KitStageFinder:
    """Finds ansible.module_utils.<stage> in the kit's folder; a stage's own modules are then
    found the ordinary way, through the package's __path__."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not fullname.startswith(PREFIX) or fullname[len(PREFIX) :] not in STAGES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(HERE)])


def _stand_ins() -> None:
    """Empty `ansible` and `ansible.module_utils` packages where Ansible is not installed."""
    try:
        import ansible.module_utils  # noqa: F401
    except ImportError:
        for name in ("ansible", "ansible.module_utils"):
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
        sys.modules["ansible"].module_utils = sys.modules["ansible.module_utils"]


if not any(getattr(finder, "__name__", "") == "KitStageFinder" for finder in sys.meta_path):
    _stand_ins()
    sys.meta_path.append(KitStageFinder)
