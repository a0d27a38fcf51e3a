"""A cache of what YAML files load to, for the ansible-playbook the tests run.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(never into the kit's own). It touches nothing of the kit and nothing of a host.

Why: every ansible-playbook builds its objects from YAML anew: ansible-core's configuration
definitions, the routing table of ansible.builtin (thousands of lines), the documentation of
each plugin it loads, and the kit's playbooks, roles and group_vars. PyYAML's constructor is
Python, so a run spent a quarter of its main process there, over two hundred runs a suite.

What: yaml.load's result, pickled, under a digest of everything it is built from: the loader
class, the text, the tags ansible-core put on it (its Origin, so every value keeps the file, line
and column it came from, and whether it is trusted as a template), the duplicate-key setting,
and the versions of ansible-core, PyYAML and Python. Only files of the checkout and of
ansible-core are kept, with the routing tables (runtime.yml) of the collections ansible-core
finds: what a test writes elsewhere (inventories, vars files that may hold a test's secrets,
extra vars) loads as before, and so does anything vaulted (an inline vault tag, or a whole
file ansible-core decrypted before loading it). Entries are the owner's alone (0600). A second
load of the same input is an unpickling, a tenth of the time.

What it does not keep: a warning the constructor gives while it builds (ansible-core's
duplicate mapping key, PyYAML's deprecated tags), which is given only the first time.
yamllint's key-duplicates rule (make lint) keeps such keys out of the checkout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import sys
import tempfile

MODULE = "yaml"
# The collection loader's routing tables: a hook ansible-core leaves for tools that cache them.
META_MODULE = "ansible.utils.collection_loader._collection_finder"
# Real paths: what a load reads is compared by its real path.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# Written by tests at run time (test hosts' inventories): content that changes every run.
NOT_KEPT = os.path.join(REPO, "tests", ".state") + os.sep


# The checkout's, then ansible-core's once it is imported.
_ROOTS = [REPO + os.sep]


def _roots() -> tuple[str, ...]:
    ansible = sys.modules.get("ansible")
    if len(_ROOTS) == 1 and ansible is not None and getattr(ansible, "__file__", None):
        _ROOTS.append(os.path.dirname(os.path.realpath(ansible.__file__)) + os.sep)
    return tuple(_ROOTS)


# ansible-core's tags of vaulted text: a whole file it decrypted, a value it decrypted.
VAULTED = ("SourceWasEncrypted", "VaultedValue")


def _tags(value) -> tuple[list[str], str | None] | None:
    """ansible-core's tags on value, as text, and the path its Origin names; None for vaulted
    text."""
    helper = sys.modules.get("ansible.module_utils._internal._datatag")
    if helper is None:
        return [], None
    tags = helper.AnsibleTagHelper.tags(value)
    if any(type(t).__name__ in VAULTED for t in tags):
        return None
    path = next(
        (t.path for t in tags if type(t).__name__ == "Origin" and getattr(t, "path", None)),
        None,
    )
    return sorted(repr(t) for t in tags), path


def _loader_key(loader) -> str:
    """What a load's result depends on besides its input: the loader, its settings, versions."""
    import yaml

    ansible = sys.modules.get("ansible.release")
    duplicates = None
    constants = sys.modules.get("ansible.constants")
    if constants is not None and loader.__module__.startswith("ansible."):
        with contextlib.suppress(Exception):
            duplicates = repr(constants.config.get_config_value("DUPLICATE_YAML_DICT_KEY"))
    return repr(
        (
            getattr(ansible, "__version__", None),
            yaml.__version__,
            sys.version,
            pickle.HIGHEST_PROTOCOL,
            f"{loader.__module__}.{loader.__qualname__}",
            duplicates,
        )
    )


def _source(stream) -> tuple[bytes, list[str], str] | None:
    """The bytes, tags and real path a load reads, where it may be kept; None otherwise."""
    if isinstance(stream, (str, bytes)):
        tagged = _tags(stream)
        if tagged is None:
            return None
        tags, path = tagged
    else:
        path = getattr(stream, "name", None)
        seekable = getattr(stream, "seekable", None)
        if not isinstance(path, (str, bytes)) or seekable is None or not seekable():
            return None
        # ansible-core opens its configuration definitions by a bytes path.
        path = os.fsdecode(path)
        # The loader names each value's file by the name it was opened by.
        tags = [f"name={path!r}"]
    if not path:
        return None
    real = os.path.realpath(path)
    if real.startswith(NOT_KEPT) or not real.startswith(_roots()):
        return None
    content = _content(stream)
    if content is None or b"!vault" in content:
        return None
    return content, tags, real


def _content(stream) -> bytes | None:
    """What stream holds, a file stream left where it was (or the load that follows would read
    nothing: a failure to put it back is the load's failure); None where it cannot say."""
    if not isinstance(stream, (str, bytes)):
        try:
            start = stream.tell()
        except (OSError, ValueError):
            return None
        read = stream.read()
        stream.seek(start)
        stream = read
    return bytes(stream.encode("utf-8", "surrogatepass") if isinstance(stream, str) else stream)


def _kept(folder: str, key: str, build):
    """The result kept under key, or build()'s, then kept. An entry that is missing or does not
    unpickle is built again; a result that cannot be kept is built again next time."""
    entry = os.path.join(folder, key)
    try:
        with open(entry, "rb") as handle:
            # Written by this harness, in the checkout's own tests/.state.
            return pickle.loads(handle.read())  # noqa: S301
    except Exception:  # noqa: S110 - loaded again below
        pass
    value = build()
    partial = None
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        # mkstemp: the owner's alone (0600), a name no other process or thread writes.
        descriptor, partial = tempfile.mkstemp(dir=folder, suffix=".partial")
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(partial, entry)
    except Exception:
        if partial:
            with contextlib.suppress(OSError):
                os.unlink(partial)
    return value


def _digest(*parts: bytes | str) -> str:
    digest = hashlib.blake2b(digest_size=20)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def patch(yaml, folder: str) -> bool:
    """Route yaml.load (and yaml.safe_load, which calls it) through the cache in folder."""
    if getattr(yaml.load, "kimi_cached", False):
        return False
    original = yaml.load

    def load(stream, Loader):
        source = _source(stream)
        if source is None:
            return original(stream, Loader)
        content, tags, path = source
        key = _digest(_loader_key(Loader), path, "\0".join(tags), content)
        return _kept(folder, key, lambda: original(stream, Loader))

    load.kimi_cached = True
    yaml.load = load
    return True


def patch_meta(finder, folder: str) -> bool:
    """Route the collection loader's routing tables (runtime.yml) through the cache."""
    original = getattr(finder, "_meta_yml_to_dict", None)
    if original is None or getattr(original, "kimi_cached", False):
        return False

    def meta_yml_to_dict(yaml_string_data, content_id):
        import yaml

        data = yaml_string_data
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)
        key = _digest("meta", _loader_key(loader), repr(content_id), bytes(data))
        return _kept(folder, key, lambda: original(yaml_string_data, content_id))

    meta_yml_to_dict.kimi_cached = True
    finder._meta_yml_to_dict = meta_yml_to_dict
    return True
