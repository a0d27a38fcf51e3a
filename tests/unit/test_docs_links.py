"""The README and docs/*.md: every relative link reaches a file (and a heading, for an #anchor),
and the Markdown keeps the rules markdownlint would hold it to, so a moved section or a renamed
heading cannot leave a user at a dead link."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) or [text](target "title"); images too. Reference-style links are not used.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and (fence is None or match.group(2)[0] == fence[0]):
            if fence is None:
                fence = match.group(2)
                continue
            if len(match.group(2)) >= len(fence) and not match.group(3).strip():
                fence = None
                continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: code marks and punctuation dropped, spaces to hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _number, line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str):
    """(line number, target) of every inline link outside code."""
    for number, line in prose_lines(text):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            yield number, target


def broken_links(path: Path, text: str) -> list[str]:
    problems = []
    for number, target in links(text):
        if SCHEME.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        where = f"{path.name}:{number}: {target}"
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            problems.append(f"{where}: no such file {destination}")
            continue
        headings = anchors(destination.read_text(encoding="utf-8")) if fragment else set()
        if fragment and destination.suffix == ".md" and fragment not in headings:
            problems.append(f"{where}: {destination.name} has no heading #{fragment}")
    return problems


def lint(text: str) -> list[str]:
    """markdownlint's rules that a hand edit most often breaks (MD001, MD009, MD010, MD012,
    MD022, MD025, MD031, MD040, MD047, MD056)."""
    problems = []
    lines = text.split("\n")
    if not text.endswith("\n") or text.endswith("\n\n"):
        problems.append("MD047: the file must end with exactly one newline")
    for number, line in enumerate(lines, 1):
        if line != line.rstrip():
            problems.append(f"{number}: MD009 trailing whitespace")
        if "\t" in line:
            problems.append(f"{number}: MD010 hard tab")
        # The last element after the final newline is empty by construction, not a blank line.
        blank_pair = number > 1 and not line.strip() and not lines[number - 2].strip()
        if blank_pair and number < len(lines):
            problems.append(f"{number}: MD012 more than one blank line")
    fence = None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if not match:
            continue
        before = lines[number - 2] if number > 1 else ""
        after = lines[number] if number < len(lines) else ""
        if fence is None:
            fence = match.group(2)
            if not match.group(3).strip():
                problems.append(f"{number}: MD040 fenced code without a language")
            if before.strip():
                problems.append(f"{number}: MD031 no blank line before the fence")
        elif match.group(2)[0] == fence[0] and len(match.group(2)) >= len(fence):
            fence = None
            if after.strip():
                problems.append(f"{number}: MD031 no blank line after the fence")
    if fence is not None:
        problems.append("a fenced code block is never closed")
    level = 0
    titles = 0
    prose = dict(prose_lines(text))
    for number, line in prose.items():
        match = HEADING.match(line)
        if match:
            depth = len(match.group(1))
            titles += depth == 1
            if level and depth > level + 1:
                problems.append(f"{number}: MD001 heading jumps from level {level} to {depth}")
            level = depth
            for neighbour in (number - 1, number + 1):
                if neighbour in prose and neighbour >= 1 and prose[neighbour].strip():
                    problems.append(f"{number}: MD022 no blank line around the heading")
        if line.startswith("|") and number - 1 in prose and prose[number - 1].startswith("|"):
            continue
        if line.startswith("|"):
            problems += table_problems(number, prose)
    if titles != 1:
        problems.append(f"MD025: {titles} top-level headings, needed exactly 1")
    return problems


def cells(row: str) -> int:
    inner = CODE_SPAN.sub("code", row.strip())
    return len(re.split(r"(?<!\\)\|", inner.strip("|")))


def table_problems(first: int, prose: dict[int, str]) -> list[str]:
    """MD056: every row of the table that starts at line `first` has the header's cells."""
    width = cells(prose[first])
    problems = []
    number = first
    while number in prose and prose[number].startswith("|"):
        if cells(prose[number]) != width:
            problems.append(f"{number}: MD056 {cells(prose[number])} cells, the header has {width}")
        number += 1
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(path):
    assert broken_links(path, path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_keeps_the_lint_rules(path):
    assert lint(path.read_text(encoding="utf-8")) == []


def test_a_dead_link_and_a_missing_heading_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Real `code` heading\n")
    page = tmp_path / "page.md"
    text = (
        "# Page\n\n[ok](other.md#real-code-heading) [gone](missing.md) "
        "[bad](other.md#nothing) [web](https://example.org/x) `[code](missing.md)`\n\n"
        "```sh\n[in a fence](missing.md)\n```\n"
    )
    assert broken_links(page, text) == [
        f"page.md:3: missing.md: no such file {tmp_path / 'missing.md'}",
        "page.md:3: other.md#nothing: other.md has no heading #nothing",
    ]


def test_anchors_follow_github_including_duplicates():
    text = "# Kit\n\n## 1. `make setup` refuses the Python\n\n## Tests\n\n### Tests\n"
    assert anchors(text) == {"kit", "1-make-setup-refuses-the-python", "tests", "tests-1"}


def test_lint_finds_each_rule_it_holds():
    text = "# A\n### Skipped\ntext \n\n\n```\ncode\n```\nafter\n\n| a | b |\n|---|---|\n| 1 |\n"
    found = lint(text)
    for rule in ("MD001", "MD009", "MD012", "MD022", "MD031", "MD040", "MD056"):
        assert any(rule in problem for problem in found), rule
