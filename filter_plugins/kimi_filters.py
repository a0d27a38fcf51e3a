"""Filters kimi_*: quoting for the files the server role writes (systemd unit, environment file).

Jinja cannot quote safely for systemd: ExecStart= splits on whitespace, expands $VAR and
%-specifiers; an EnvironmentFile value needs double quotes and escapes. These do it once.
"""

from __future__ import annotations

import re

DOCUMENTATION = r"""
name: kimi_filters
short_description: Quoting filters for systemd units and environment files
description:
  - C(systemd_exec_line) turns an argv list into the value of ExecStart=.
  - C(env_file_line) turns a key and a value into one EnvironmentFile line.
"""

PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _double_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_exec_line(argv: list) -> str:
    words = []
    for arg in map(str, argv):
        if "\n" in arg:
            raise ValueError(f"argument with a newline cannot go into ExecStart=: {arg!r}")
        word = arg if PLAIN.match(arg) else _double_quoted(arg)
        # systemd expands %-specifiers and $VARIABLES in ExecStart=; doubling keeps them literal.
        words.append(word.replace("%", "%%").replace("$", "$$"))
    return " ".join(words)


def env_file_line(key: str, value) -> str:
    key = str(key)
    if not ENV_NAME.match(key):
        raise ValueError(f"not a valid environment variable name: {key!r}")
    value = str(value)
    if "\n" in value:
        raise ValueError(f"environment value of {key} has a newline")
    return f"{key}={_double_quoted(value)}"


class FilterModule:
    def filters(self):
        return {"systemd_exec_line": systemd_exec_line, "env_file_line": env_file_line}
