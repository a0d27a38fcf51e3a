"""Masking secrets in text: the values given (an API key, an HF token), every form a server or
a log can show them in (base64 at each alignment, unkeyed digests), and values nobody listed
that are shaped like secrets. One place for the benchmark client, the debug collector on the
hosts and the analysis' bundle on the controller: standard library only, imported as
`ansible.module_utils.host.secret_scrub` by both (the analysis through module_utils/__init__.py)."""

from __future__ import annotations

import base64
import hashlib
import re
import string

from ansible.module_utils.contract.secrets import MASK

# A secret shorter than this has no base64 form worth masking: its few characters would
# match ordinary text.
MIN_BASE64_SECRET = 8


def secret_forms(secrets) -> list[str]:
    """The secrets as they can appear in what a server echoes: as they are, and the part of
    their base64 encoding (standard and URL-safe) that only their own bytes decide, at each
    of the three alignments they can have inside a longer encoded text (an Authorization
    header echoed encoded). Longest first, so that a form is masked before a part of it."""
    forms = set()
    for secret in secrets:
        if not isinstance(secret, str) or not secret:
            continue
        forms.add(secret)
        raw = secret.encode()
        if len(raw) < MIN_BASE64_SECRET:
            continue
        for offset in range(3):
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                text = encode(b"\0" * offset + raw + b"\0\0").decode()
                # Characters wholly inside the secret's bits: the first one starts at or
                # after its first bit, the last one ends at or before its last bit.
                first = -(-offset * 8 // 6)
                forms.add(text[first : (offset + len(raw)) * 8 // 6])
    return sorted(forms, key=len, reverse=True)


# Unkeyed digests of a secret are the secret to a dictionary attack: masked like it.
DIGESTS = ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "blake2s")
# Secrets nobody listed, each with the words that must be near it (ASCII case-folded, found
# with str.find, which is fast, before any expression runs on a window around each find): a
# Hugging Face token, a bearer header, an api_key assignment or JSON value (SGLang prints its
# ServerArgs, api_key included, when it starts), a --api-key argument, a URL's password. The
# value of an empty or None assignment stays: it says that no key was set.
PATTERNS = (
    (("hf_",), False, re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    (
        ("bearer",),
        True,
        re.compile(r"(?i)(\bauthorization[ \t]*[:=][ \t]*[\"']?bearer[ \t]+)([^\s\"',]+)"),
    ),
    (
        ("api_key", "api-key", "apikey"),
        True,
        re.compile(
            r"(?i)(\b[a-z0-9_]*api[_-]?key[ \t]*=[ \t]*)('[^'\n]*'|\"[^\"\n]*\"|[^\s,)'\"]+)"
        ),
    ),
    (("--api-key",), True, re.compile(r"(?i)(--api-key[ \t]+)([^\s'\"]+)")),
    (
        ("api_key", "api-key", "apikey"),
        True,
        re.compile(r"(?i)(\"api[_-]?key\"[ \t]*:[ \t]*\")((?:[^\"\\\n]|\\.)*)(?=\")"),
    ),
    (("://",), False, re.compile(r"(?i)(\b[a-z][a-z0-9+.-]{0,31}://[^/\s:@]+:)([^@\s/]+)(?=@)")),
)
UNSET_VALUES = {"", "''", '""', "none", "null"}
# Around each find, the characters a pattern's match may start before it and end after it.
LOOK_BEHIND = 256
LOOK_AHEAD = 1 << 16
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def folded(text: str) -> str:
    """ASCII letters lowered, every other character kept, so positions stay (what
    bytes.lower() does, as a scanner folds case)."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


class Scrubber:
    """Masks the given secret forms wherever they appear (ASCII case-folded) and the PATTERNS;
    counts what it masked, never what. Linear in the text: each form and trigger is one
    str.find pass, and expressions run only on windows around what was found."""

    def __init__(self, secrets):
        secrets = [s for s in secrets if isinstance(s, str) and s]
        forms = set(secret_forms(secrets))
        for secret in secrets:
            forms.update(hashlib.new(name, secret.encode()).hexdigest() for name in DIGESTS)
        self.forms = sorted(forms, key=len, reverse=True)
        self.count = 0

    def __call__(self, text: str) -> str:
        return self.text(text)

    def bytes(self, data: bytes) -> bytes:
        # surrogateescape: bytes that are no UTF-8 come back as they were.
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def text(self, text: str) -> str:
        hay = folded(text)
        for form in self.forms:
            needle = folded(form)
            pos = hay.find(needle)
            if pos == -1:
                continue
            pieces, last = [], 0
            while pos != -1:
                pieces += [text[last:pos], MASK]
                self.count += 1
                last = pos + len(form)
                pos = hay.find(needle, last)
            text = "".join(pieces) + text[last:]
            hay = folded(text)
        for triggers, fold, pattern in PATTERNS:
            for trigger in triggers:
                counted = self.count
                text = self._around(text, hay if fold else text, trigger, pattern)
                if self.count != counted:
                    hay = folded(text)
        return text

    def _around(self, text: str, hay: str, trigger: str, pattern: re.Pattern) -> str:
        pos = hay.find(trigger)
        if pos == -1:
            return text
        pieces, last = [], 0
        while pos != -1:
            start = max(last, pos - LOOK_BEHIND)
            end = pos + len(trigger) + LOOK_AHEAD
            # A later find whose own window reaches into this one joins it: a match may start
            # up to LOOK_BEHIND before its trigger and end up to LOOK_AHEAD after it, so one
            # found near this window's end must not be cut at it (nor skipped).
            after = hay.find(trigger, pos + 1)
            while after != -1 and after - LOOK_BEHIND <= end:
                end = after + len(trigger) + LOOK_AHEAD
                after = hay.find(trigger, after + 1)
            end = min(len(text), end)
            pieces += [text[last:start], pattern.sub(self._pattern_mask, text[start:end])]
            last = end
            pos = after
        return "".join(pieces) + text[last:]

    def _pattern_mask(self, match: re.Match) -> str:
        if match.re.groups == 0:
            self.count += 1
            return MASK
        value = match.group(2)
        if value.strip().lower() in UNSET_VALUES or value.strip("'\"") == MASK:
            return match.group(0)
        self.count += 1
        quote = value[0] if value[:1] in ("'", '"') and value[-1:] == value[:1] else ""
        return f"{match.group(1)}{quote}{MASK}{quote}"
