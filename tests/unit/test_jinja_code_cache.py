"""The cache of compiled templates the tests' ansible-playbook keeps
(tests/support/jinja_code_cache.py): what a template renders to is the same with it, a second
process compiles nothing it compiled before, and an entry is not used where what Jinja compiled
in has changed (a filter's calling convention, the lexer's settings, backslash escaping), nor
where a template does not compile."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jinja2
import pytest

from tests.support import jinja_code_cache
from tests.support.ansible_run import cache_env, python_json

REPO = Path(__file__).resolve().parents[2]


class _Context:
    """ansible-core's ambient compile contexts: `current(optional=True)` or None."""

    value = None

    @classmethod
    def current(cls, optional=False):
        return cls.value


def jinja_bits(compiles: list):
    """A module laid out as ansible-core's _jinja_bits, over plain Jinja, counting parses."""

    class AnsibleEnvironment(jinja2.Environment):
        _debuggable_template_source = False

        def _parse(self, source, name, filename):
            compiles.append(source)
            return super()._parse(source, name, filename)

    class Compiling(_Context):
        value = None

    class Debugging(_Context):
        value = None

    return types.SimpleNamespace(
        AnsibleEnvironment=AnsibleEnvironment,
        _TemplateCompileContext=Compiling,
        _CompileStateSmugglingCtx=Debugging,
    )


def shout(value):
    return str(value).upper()


@jinja2.pass_environment
def shout_with_env(env, value):
    return str(value).upper() + "!"


def test_a_cached_template_renders_the_same_and_is_not_compiled_again(tmp_path):
    compiles = []
    module = jinja_bits(compiles)
    assert jinja_code_cache.patch(module, str(tmp_path)) is True
    assert jinja_code_cache.patch(module, str(tmp_path)) is False  # once per process
    env = module.AnsibleEnvironment()
    env.filters["shout"] = shout
    source = "{% for x in items %}{{ x | shout }}{% if x is even %}+{% endif %}{% endfor %}"
    assert env.from_string(source).render(items=[1, 2]) == "12+"
    assert env.from_string(source).render(items=[3]) == "3"
    assert compiles == [source]
    assert len(list(tmp_path.iterdir())) == 1
    # Another environment of the same settings (another worker) reads the entry.
    other = module.AnsibleEnvironment()
    other.filters["shout"] = shout
    assert other.from_string(source).render(items=[4]) == "4+"
    assert compiles == [source]


def test_an_entry_is_not_used_where_a_filter_is_called_otherwise(tmp_path):
    compiles = []
    module = jinja_bits(compiles)
    jinja_code_cache.patch(module, str(tmp_path))
    env = module.AnsibleEnvironment()
    env.filters["shout"] = shout
    assert env.from_string("{{ 'a' | shout }}").render() == "A"
    # The same name, now taking the environment: Jinja compiles the call differently.
    changed = module.AnsibleEnvironment()
    changed.filters["shout"] = shout_with_env
    assert changed.from_string("{{ 'a' | shout }}").render() == "A!"
    assert len(compiles) == 2
    # An environment without the filter fails as Jinja does.
    missing = module.AnsibleEnvironment()
    with pytest.raises(jinja2.TemplateSyntaxError, match="No filter named 'shout'"):
        missing.from_string("{{ 'a' | shout }}")


def test_lexer_settings_and_backslash_escaping_are_part_of_the_key(tmp_path):
    compiles = []
    module = jinja_bits(compiles)
    jinja_code_cache.patch(module, str(tmp_path))
    source = "[[ a ]]{{ a }}"
    assert module.AnsibleEnvironment().from_string(source).render(a=1) == "[[ a ]]1"
    brackets = module.AnsibleEnvironment(variable_start_string="[[", variable_end_string="]]")
    assert brackets.from_string(source).render(a=1) == "1{{ a }}"
    module._TemplateCompileContext.value = types.SimpleNamespace(escape_backslashes=True)
    try:
        module.AnsibleEnvironment().from_string(source)
    finally:
        module._TemplateCompileContext.value = None
    assert len(compiles) == 3


def test_syntax_errors_debugging_and_node_templates_compile_as_before(tmp_path):
    compiles = []
    module = jinja_bits(compiles)
    jinja_code_cache.patch(module, str(tmp_path))
    env = module.AnsibleEnvironment()
    for _ in range(2):
        with pytest.raises(jinja2.TemplateSyntaxError):
            env.from_string("{{ a ")
    assert not list(tmp_path.iterdir())
    module._CompileStateSmugglingCtx.value = object()
    try:
        assert env.from_string("{{ 1 }}").render() == "1"
    finally:
        module._CompileStateSmugglingCtx.value = None
    assert env.compile_expression("a + 1")(a=1) == 2
    assert not list(tmp_path.iterdir())
    # A damaged entry is compiled again.
    env.from_string("{{ 2 }}")
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(b"damaged")
    assert env.from_string("{{ 2 }}").render() == "2"


def test_an_ansible_core_laid_out_otherwise_is_left_alone():
    assert jinja_code_cache.patch(types.SimpleNamespace(), "/nonexistent") is False


# Renders the kit's own group_vars through ansible-core's templar, as a playbook does.
RENDER = """
import json, sys
sys.path.insert(0, {repo!r})
from ansible._internal._templating import _jinja_bits
parses = []
real = _jinja_bits.AnsibleEnvironment._parse
_jinja_bits.AnsibleEnvironment._parse = lambda self, s, *a: (parses.append(s), real(self, s, *a))[1]
from ansible.template import Templar
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible._internal._datatag._tags import TrustedAsTemplate
import yaml
init_plugin_loader()
import glob
variables = {{"playbook_dir": {repo!r}, "ansible_config_file": {repo!r} + "/ansible.cfg",
             "inventory_hostname": "h", "groups": {{"all": ["h"]}}}}
for path in sorted(glob.glob({repo!r} + "/group_vars/all/*.yml")):
    with open(path) as handle:
        for key, value in yaml.safe_load(handle).items():
            variables[key] = TrustedAsTemplate().tag(value) if isinstance(value, str) else value
templar = Templar(loader=DataLoader(), variables=variables)
out = {{name: templar.template(TrustedAsTemplate().tag("{{{{ " + name + " | to_json }}}}"))
        for name in ("kimi_repos", "kimi_serving_configs", "kimi_serving_config_definitions")}}
print(json.dumps({{"out": out, "parses": len(parses)}}))
"""


def render(folder) -> dict:
    env = cache_env("KIT_TEST_JINJA_CODE_DIR", folder)
    return python_json(RENDER.format(repo=str(REPO)), env)


def test_ansible_core_s_templar_renders_the_kit_s_variables_the_same_from_the_cache(tmp_path):
    plain = render(None)
    first = render(tmp_path)
    second = render(tmp_path)
    assert first["out"] == plain["out"] == second["out"]
    assert "ddtree" in json.loads(plain["out"]["kimi_serving_config_definitions"])
    assert plain["parses"] > 10 and first["parses"] < plain["parses"]
    assert second["parses"] == 0
