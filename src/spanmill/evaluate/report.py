"""The evaluation as a person reads it: one PNG of the rates, one self-contained HTML page."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from spanmill.evaluate.scoring import Outcome

if TYPE_CHECKING:
    from spanmill.evaluate.comparison import Comparison

_RATES = (("success_rate", "success"), ("format_validity", "format valid"))
_COLOURS = {"champion": "#7f7f7f", "challenger": "#2ca02c"}


def rates_png(report: Comparison, path: Path) -> Path:
    """Success and format validity per suite, champion beside challenger, with the CI of the
    gate metric's difference written above each suite."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = list(report.suites.values())
    figure, axes_list = plt.subplots(
        1, max(1, len(suites)), figsize=(5 * max(1, len(suites)), 4), dpi=110, squeeze=False
    )
    for axes, suite in zip(axes_list[0], suites, strict=False):
        width = 0.38
        for offset, role in ((-width / 2, "champion"), (width / 2, "challenger")):
            summary = suite.champion if role == "champion" else suite.challenger
            values = [summary.metric(name) for name, _ in _RATES]
            bars = axes.bar(
                [i + offset for i in range(len(_RATES))],
                values,
                width,
                label=f"{role} ({report.models[role].label})",
                color=_COLOURS[role],
            )
            axes.bar_label(bars, fmt="%.2f", fontsize=8)
        difference = suite.difference
        axes.set_title(
            f"{suite.name}: n={suite.challenger.n}\n"
            f"Δ {suite.metric} {difference.estimate:+.3f} "
            f"[{difference.low:+.3f}, {difference.high:+.3f}]",
            fontsize=10,
        )
        axes.set_xticks(range(len(_RATES)), [label for _, label in _RATES])
        axes.set_ylim(0, 1.15)
        axes.legend(fontsize=8, loc="upper left")
    figure.suptitle(f"{report.task}: {report.decision.verdict}", fontsize=12)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def html_page(
    report: Comparison, png: Path, outcomes: Mapping[str, Sequence[Outcome]], examples: int = 5
) -> str:
    """A page with the decision, the rates, the intervals, the picture and a few failures."""
    e = html.escape
    rows = []
    for suite in report.suites.values():
        for role in ("champion", "challenger"):
            s = suite.champion if role == "champion" else suite.challenger
            rows.append(
                f"<tr><td>{e(suite.name)}</td><td>{role}</td><td>{e(report.models[role].label)}</td>"
                f"<td>{s.n}</td><td>{s.mean_reward:.3f}</td><td>{s.success_rate:.3f}</td>"
                f"<td>{s.format_validity:.3f}</td><td>{s.tokens_per_answer:.1f}</td></tr>"
            )
        d = suite.difference
        rows.append(
            f"<tr class='diff'><td>{e(suite.name)}</td><td colspan='4'>difference in "
            f"{e(suite.metric)} (challenger - champion)</td><td colspan='3'>"
            f"{d.estimate:+.3f}, {d.confidence:.0%} CI [{d.low:+.3f}, {d.high:+.3f}]</td></tr>"
        )
    failures = []
    for key, items in outcomes.items():
        shown = [o for o in items if not o.success][:examples]
        for outcome in shown:
            turns = "".join(
                f"<div class='turn'><b>{e(str(m.get('role')))}</b>: "
                f"{e(str(m.get('content'))[:400])}</div>"
                for m in outcome.transcript
            )
            failures.append(
                f"<details><summary>{e(key)} · {e(outcome.item_id)} · "
                f"{e(outcome.explanation)}</summary>{turns}</details>"
            )
    picture = base64.b64encode(png.read_bytes()).decode()
    decision = report.decision
    colour = "#2ca02c" if decision.promote else "#d62728"
    reasons = "".join(f"<li>{e(reason)}</li>" for reason in decision.reasons)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>spanmill evaluation: {e(report.task)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: .3em .6em; }}
tr.diff td {{ background: #f5f5f5; }} .turn {{ font-family: monospace; white-space: pre-wrap; }}
.decision {{ color: {colour}; }}
</style></head><body>
<h1>Evaluation of {e(report.models["challenger"].label)} on {e(report.task)}</h1>
<h2 class="decision">Gate: {decision.verdict}</h2><ul>{reasons}</ul>
<p>Policy: suite <code>{e(report.policy.suite)}</code>,
metric <code>{e(report.policy.metric)}</code>, margin {report.policy.margin},
format tolerance {report.policy.format_tolerance},
other rates' tolerance {report.policy.regression_tolerance},
significance required: {report.policy.require_significant}.</p>
<p>Champion: {e(report.models["champion"].describe())}<br>
Challenger: {e(report.models["challenger"].describe())}</p>
<table><tr><th>suite</th><th>model</th><th>name</th><th>n</th><th>mean reward</th>
<th>success</th><th>format valid</th><th>tokens/answer</th></tr>{"".join(rows)}</table>
<h2>Evaluator metrics</h2>{_scores_table(report)}
<p><img alt="rates" src="data:image/png;base64,{picture}"></p>
<h2>Evaluators</h2>{_evaluators_html(report)}
<h2>Some failures</h2>{"".join(failures) or "<p>none</p>"}
</body></html>
"""


def _scores_table(report: Comparison) -> str:
    e = html.escape
    rows = [
        f"<tr><td>{e(suite.name)}</td><td>{e(name)}</td>"
        f"<td>{suite.champion.scores.get(name, 0.0):.3f}</td><td>{value:.3f}</td></tr>"
        for suite in report.suites.values()
        for name, value in suite.challenger.scores.items()
    ]
    if not rows:
        return "<p>none</p>"
    return (
        "<table><tr><th>suite</th><th>metric</th><th>champion</th><th>challenger</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _evaluators_html(report: Comparison) -> str:
    e = html.escape
    parts = []
    for name, described in report.evaluators.items():
        facts = "".join(
            f"<li><b>{e(key)}</b>: <span class='turn'>{e(value)}</span></li>"
            for key, value in described.items()
        )
        parts.append(f"<h3>{e(name)}</h3><ul>{facts}</ul>")
    return "".join(parts) or "<p>none</p>"


def markdown_page(report: Comparison) -> str:
    """The decision and the figures as Markdown: the run's visualisation in the Kubeflow UI."""
    decision = report.decision
    lines = [
        f"# Evaluation of {report.models['challenger'].label} on {report.task}",
        "",
        f"**Gate: {decision.verdict}** (suite `{report.policy.suite}`, metric "
        f"`{report.policy.metric}`, margin {report.policy.margin})",
        "",
        *[f"- {reason}" for reason in decision.reasons],
        "",
        f"Champion: {report.models['champion'].describe()}  ",
        f"Challenger: {report.models['challenger'].describe()}",
        "",
        "| suite | metric | champion | challenger |",
        "| --- | --- | ---: | ---: |",
    ]
    for suite in report.suites.values():
        names = [*(key for key, _ in _RATES), *suite.challenger.scores]
        for name in names:
            lines.append(
                f"| {suite.name} | {name} | {suite.champion.metric(name):.3f} | "
                f"{suite.challenger.metric(name):.3f} |"
            )
        d = suite.difference
        lines.append(
            f"| {suite.name} | Δ {suite.metric} | | {d.estimate:+.3f} "
            f"[{d.low:+.3f}, {d.high:+.3f}] ({d.confidence:.0%}) |"
        )
    for name, described in report.evaluators.items():
        if "prompt_version" in described:
            lines += ["", f"Evaluator `{name}`: prompt {described['prompt_version']}, "
                      f"model {described.get('model', '?')}"]  # fmt: skip
    return "\n".join(lines) + "\n"
