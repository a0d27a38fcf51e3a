"""Self-contained HTML: inline CSS, plots as data: URIs, no script, nothing fetched."""

from __future__ import annotations

import base64
import html
import json

from ansible.module_utils.contract import metrics

from analysis import comparability
from analysis.plots import Plot
from analysis.tables import fmt

STYLE = """
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 1.5em auto;
       max-width: 1500px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; white-space: nowrap; }
td.note { white-space: normal; min-width: 20em; }
.scroll { overflow-x: auto; max-width: 100%; }
th { background: #f2f2f2; position: sticky; top: 0; }
td.text, th.text { text-align: left; }
tr.flagged td { background: #fde8e8; } tr.warn td { background: #fff6df; }
.plots { display: flex; flex-wrap: wrap; gap: 1em 2em; align-items: flex-start; }
figure { margin: 0; max-width: 100%; } figure img { max-width: 100%; border: 1px solid #eee; }
figure h3 { font-size: 1em; margin: 0.6em 0 0.3em; }
figcaption { font-size: 13px; color: #555; max-width: 48em; }
.kind { font: 11px monospace; border: 1px solid #ccc; border-radius: 3px; padding: 0 3px; }
.error { color: #a40000; } .warning { color: #8a5a00; } .info { color: #555; }
code, pre { font-size: 12px; background: #f6f6f6; } pre { padding: 0.5em; white-space: pre-wrap; }
.meta { color: #555; font-size: 13px; }
"""
# Left-aligned words: the summary's text columns (module_utils/contract/metrics.py text) and
# the other tables'.
TEXT_COLUMNS = metrics.text_columns() | {
    "note",
    "band",
    "levels",
    "scorer",
    "verdict",
    "check",
    "result",
    "found",
    "expected",
    "fix",
    "figures",
    "acceptance_source",
    "slower_than_predicted",
    "budgets",
    "explanation",
}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


# Free text that wraps instead of widening the table.
WRAPPED_COLUMNS = {"note", "found", "expected", "fix", "explanation"}


def _css(column: str) -> str:
    return "text note" if column in WRAPPED_COLUMNS else "text" if column in TEXT_COLUMNS else ""


def table_html(rows: list[dict], columns, row_class=None) -> str:
    head = "".join(
        f'<th class="{"text" if c in TEXT_COLUMNS else ""}">{esc(c)}</th>' for c in columns
    )
    body = []
    for row in rows:
        css = row_class(row) if row_class else ""
        cells = "".join(f'<td class="{_css(c)}">{esc(fmt(row.get(c), c))}</td>' for c in columns)
        body.append(f'<tr class="{css}">{cells}</tr>')
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def figure_html(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<figure id="plot-{esc(plot.name)}"><h3>{esc(plot.title)}</h3>'
        f'<img alt="{esc(plot.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{esc(plot.caption)}</figcaption></figure>"
    )


def warnings_html(warnings: list[dict]) -> str:
    if not warnings:
        return "<p>None: every level ran cleanly, no client saturated, no config flagged.</p>"
    items = "".join(
        f'<li class="{esc(w["severity"])}"><b>{esc(w["severity"])}</b> '
        f'<span class="kind">{esc(w.get("kind", ""))}</span> '
        f"<code>{esc(w['where'])}</code>: {esc(w['message'])}</li>"
        for w in warnings[:500]
    )
    more = f"<p>... and {len(warnings) - 500} more (report.json)</p>" if len(warnings) > 500 else ""
    return f"<ul>{items}</ul>{more}"


def provenance_html(provenance: dict) -> str:
    """Per host, what it ran on; per config, the launch and runtime."""
    parts = []
    for host, info in provenance.items():
        gpu = info.get("gpu") or {}
        models = ", ".join(f"{n}x {m}" for m, n in (gpu.get("models") or {}).items())
        facts = [
            ("profile", info.get("profile")),
            ("GPUs", models),
            ("interconnect", gpu.get("interconnect")),
            ("driver / CUDA", f"{gpu.get('driver_version')} / {gpu.get('cuda_version')}"),
            ("SGLang", ", ".join(sorted(map(str, info.get("sglang_versions") or [])))),
            ("kit", ", ".join(sorted(map(str, info.get("kit_versions") or [])))),
            ("measured", f"{info.get('first_started')} to {info.get('last_ended')}"),
        ]
        rows = "".join(
            f'<tr><th class="text">{esc(k)}</th><td class="text">{esc(v)}</td></tr>'
            for k, v in facts
        )
        configs = []
        for config, launch in info.get("configs", {}).items():
            argv = " ".join(map(str, launch.get("argv") or []))
            environment = " ".join(f"{k}={v}" for k, v in (launch.get("environment") or {}).items())
            runtime = launch.get("runtime_detail") or {}
            commit = (runtime.get("git") or {}).get("commit")
            configs.append(
                f"<details><summary><code>{esc(config)}</code> - runtime "
                f"{esc(launch.get('runtime') or '?')}"
                f"{esc(' ' + str(commit)) if commit else ''}"
                f"</summary><pre>{esc(environment)}\n{esc(argv)}</pre></details>"
            )
        weights = "".join(
            f"<li>{esc(w.get('role'))}: <code>{esc(w.get('repo_id'))}</code> at "
            f"<code>{esc(w.get('revision'))}</code></li>"
            for w in info.get("weights", [])
            if isinstance(w, dict)
        )
        prompts = "".join(
            f"<li>{esc(name)}: sha256 <code>{esc(sha)}</code></li>"
            for name, sha in sorted((info.get("prompts") or {}).items())
        )
        parts.append(
            f"<h3>{esc(host)}</h3><table>{rows}</table>"
            f"<p>Weights</p><ul>{weights or '<li>not recorded</li>'}</ul>"
            f"<p>Prompt sets</p><ul>{prompts or '<li>not recorded</li>'}</ul>"
            f"<p>Launches</p>{''.join(configs) or '<p>not recorded</p>'}"
        )
    return "".join(parts)


def model_html(model: dict | None) -> str:
    """The model under test, as run.json records it (analysis.results.run_model)."""
    if not model:
        return (
            "<p>Model: unknown (run.json records none: a run from before models were data, "
            "or a folder without its run.json).</p>"
        )
    target = model.get("target") or {}
    facts = [
        ("model", model.get("name")),
        ("title", model.get("title")),
        ("attention", model.get("attention")),
        ("target", target.get("repo_id")),
        ("revision", target.get("revision")),
    ]
    rows = "".join(
        f'<tr><th class="text">{esc(k)}</th><td class="text">{esc(v or "unknown")}</td></tr>'
        for k, v in facts
    )
    return f"<table>{rows}</table>"


def page(title: str, sections: list[tuple[str, str, str]], meta: str) -> str:
    nav = " | ".join(f'<a href="#{esc(anchor)}">{esc(name)}</a>' for anchor, name, _ in sections)
    body = "".join(
        f'<section id="{esc(anchor)}"><h2>{esc(name)}</h2>{content}</section>'
        for anchor, name, content in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{esc(title)}</h1><p class="meta">{meta}</p><p>{nav}</p>{body}</body></html>\n'
    )


def json_block(value) -> str:
    return f"<pre>{esc(json.dumps(value, indent=1, sort_keys=True, default=str))}</pre>"


def comparability_section(found: list[dict]) -> str:
    """compare.html's Comparability section: both kinds, the ones that matter first."""
    intro = (
        "<p>Every recorded difference between the runs that could explain a difference in "
        "their results, one per field: benchmark settings, prompt and workload hashes, "
        "weights revisions, the SGLang runtime and its package set, each config's launch argv "
        "and environment, and the GPUs. <b>not_comparable</b>: the results do not measure the "
        "same thing; <b>expected_difference</b>: what comparing hardware or models on purpose "
        "changes. Fields only one run records are not compared.</p>"
    )
    if not found:
        return intro + (
            "<p>None: both runs used the same settings, prompts, weights, runtime, launches "
            "and hardware, as far as both record them.</p>"
        )
    parts = []
    for kind, heading in (
        (comparability.NOT_COMPARABLE, "Not comparable"),
        (comparability.EXPECTED, "Expected differences"),
    ):
        listed = [w for w in found if w["kind"] == kind]
        if listed:
            parts.append(f"<h3>{heading} ({len(listed)})</h3>" + warnings_html(listed))
    return intro + "".join(parts)
