"""A cache of the Python code Jinja compiles templates to, for the ansible-playbook the tests run.

tests/support/controller_site/sitecustomize.py installs it into the playbooks the tests run
(never into the kit's own). It touches nothing of the kit and nothing of a host.

Why: ansible-core 2.19 compiles a template string anew each time it renders one (lexing,
parsing, generating Python source, compiling that), and a variable defined by a template is
rendered on every reference: the kit's group_vars nest them (kimi_repos renders a dozen), so a
reference costs tens of milliseconds, and every task's worker process starts with nothing
compiled. Most of a worker's templating time was compiling the same strings again.

What: Environment.compile's code object is kept on disk under a digest of everything Jinja's
compiler reads besides the source: the lexer's settings (with ansible-core's backslash escaping
of the moment), the extensions, async, the sandbox, the finalize function's calling convention,
autoescape, and the name and file name it is given. The one input a digest cannot hold is the
filter and test functions (how each is called is compiled in), so an entry lists the filters
and tests its template names with what each was at compile time, and is used only where each
is still the same. Anything else (a template given as nodes, raw source, ansible-core's template
debugging, an unreadable entry) compiles as before: the cache can only save time.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys

MODULE = "ansible._internal._templating._jinja_bits"


def _lexer_settings(env) -> tuple:
    return (
        env.block_start_string,
        env.block_end_string,
        env.variable_start_string,
        env.variable_end_string,
        env.comment_start_string,
        env.comment_end_string,
        env.line_statement_prefix,
        env.line_comment_prefix,
        env.trim_blocks,
        env.lstrip_blocks,
        env.newline_sequence,
        env.keep_trailing_newline,
    )


def patch(jinja_bits, folder: str) -> bool:
    """Route AnsibleEnvironment.compile through the cache in folder."""
    import jinja2
    from jinja2 import nodes
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.utils import _PassArg, internalcode

    environment = getattr(jinja_bits, "AnsibleEnvironment", None)
    compile_context = getattr(jinja_bits, "_TemplateCompileContext", None)
    debug_context = getattr(jinja_bits, "_CompileStateSmugglingCtx", None)
    if not (isinstance(environment, type) and compile_context and debug_context):
        return False
    if getattr(environment.compile, "kimi_cached", False):
        return False
    import ansible

    salt = f"{ansible.__version__}|{jinja2.__version__}|{marshal.version}|{sys.version}"

    def calling(func) -> str:
        return "missing" if func is None else repr(_PassArg.from_obj(func))

    def settings(env) -> str:
        current = compile_context.current(optional=True)
        autoescape = env.autoescape
        return repr(
            (
                salt,
                type(env).__qualname__,
                _lexer_settings(env),
                getattr(current, "escape_backslashes", None),
                sorted(env.extensions),
                env.is_async,
                env.sandboxed,
                calling(env.finalize) if env.finalize else None,
                autoescape
                if isinstance(autoescape, bool)
                else getattr(autoescape, "__qualname__", "?"),
            )
        )

    def functions_named(tree) -> tuple:
        found = {("filter", node.name) for node in tree.find_all(nodes.Filter)}
        found |= {("test", node.name) for node in tree.find_all(nodes.Test)}
        return tuple(sorted(found))

    def still_the_same(env, functions) -> bool:
        for kind, name, how in functions:
            table = env.filters if kind == "filter" else env.tests
            if calling(table.get(name)) != how:
                return False
        return True

    @internalcode
    def compile_cached(self, source, name=None, filename=None, raw=False, defer_init=False):
        if (
            raw
            or not isinstance(source, str)
            or self._debuggable_template_source
            or debug_context.current(optional=True) is not None
        ):
            return original(self, source, name, filename, raw, defer_init)
        key = hashlib.blake2b(
            "\0".join([settings(self), repr((name, filename, defer_init)), source]).encode(
                "utf-8", "surrogatepass"
            ),
            digest_size=20,
        ).hexdigest()
        entry = os.path.join(folder, key)
        try:
            with open(entry, "rb") as handle:
                # Written by this harness, in the checkout's own tests/.state.
                functions, code = marshal.loads(handle.read())  # noqa: S302
            if still_the_same(self, functions):
                return code
        except Exception:  # noqa: S110 - a missing or damaged entry is compiled again
            pass
        try:
            tree = self._parse(source, name, filename)
            generated = self._generate(tree, name, filename, defer_init=defer_init)
            code = self._compile(generated, "<template>" if filename is None else filename)
        except TemplateSyntaxError:
            self.handle_exception(source=source)
        functions = tuple(
            (kind, fname, calling((self.filters if kind == "filter" else self.tests).get(fname)))
            for kind, fname in functions_named(tree)
        )
        partial = f"{entry}.{os.getpid()}.partial"
        try:
            with open(partial, "wb") as handle:
                handle.write(marshal.dumps((functions, code)))
            os.replace(partial, entry)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(partial)
        return code

    original = environment.compile
    compile_cached.kimi_cached = True
    environment.compile = compile_cached
    return True
