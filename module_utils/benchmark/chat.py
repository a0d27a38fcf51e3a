"""Prompts from templates: a model's chat template found in its folder and rendered as
transformers renders it, and a dataset row's fields filled into a prompt set's template.

Standard library only: this runs on GPU hosts under whatever Python they have. jinja2 (for
chat templates) is imported only by the function that renders.
"""

from __future__ import annotations

import json
import os
import re


def special_tokens(config: dict) -> dict:
    """bos_token and friends from a tokenizer_config.json, as the template sees them."""
    found = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    return found


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def template_files(folder: str) -> dict[str, str]:
    """The model folder's files chat_template_of reads, {name: text}, those that can be read."""
    files = {}
    for name in TEMPLATE_FILES:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                files[name] = handle.read()
        except OSError:
            pass
    return files


def chat_template_of(files: dict) -> tuple[str | None, str]:
    """The chat template and where it came from, given the model folder's files
    {name: text}: chat_template.jinja, chat_template.json, then tokenizer_config.json's
    chat_template (a string, or a list of named templates of which `default` is used)."""
    if files.get("chat_template.jinja"):
        return files["chat_template.jinja"], "chat_template.jinja"
    for name in ("chat_template.json", "tokenizer_config.json"):
        if not files.get(name):
            continue
        template = json.loads(files[name]).get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template, name
    return None, ""


def render_chat(template: str, messages: list[dict], tokens: dict, kwargs: dict) -> str:
    """Render messages through a Hugging Face chat template as transformers does: a sandboxed
    jinja2 environment with trim_blocks, lstrip_blocks, loop controls, a tojson that keeps
    non-ASCII, raise_exception and strftime_now, and the generation prompt appended."""
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    class Generation(jinja2.ext.Extension):
        # {% generation %} marks assistant text for training masks; rendering ignores it.
        tags = {"generation"}  # noqa: RUF012 - jinja2's own API

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Generation, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    values = {**tokens, "add_generation_prompt": True, **kwargs, "messages": messages}
    return environment.from_string(template).render(**values)


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?\}")


def fill(template: str, row: dict) -> str:
    """`template` with each {field} or {field[i]} replaced by the row's value; other braces
    (a LaTeX \\boxed{}) stay as they are, and no doubled braces clash with Jinja."""

    def value(match):
        item = row[match.group(1)]
        if match.group(2) is not None:
            item = item[int(match.group(2))]
        return str(item)

    return _FIELD.sub(value, template)


def prompt_of(row: dict, template: str) -> list[dict]:
    """The chat messages of one dataset row: `template` over the row's fields (such as
    "{question}" or "{turns[0]}") as the user's message."""
    return [{"role": "user", "content": fill(template, row)}]
