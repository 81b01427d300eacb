"""The report of ``meanfield reproduce``: ``DIR/REPORT.md`` and a self-contained ``DIR/report.html``.

On top the failing checks, listed plainly, and a table of the experiments (checks passed / total,
time). For each paper: the claim, the figures, the table of every check (name, theory, measured,
tolerance with its kind: relative, absolute, bound or qualitative with the rule in words; pass;
the note's first sentence, the rest folded), the settings and the time each part took.
"""

from __future__ import annotations

import base64
import html
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import _paths
from ._common import first_sentence, tolerance_rule

__all__ = ["tolerance_text", "total_seconds", "write_report"]

_CLAIMS = {
    "usa-av": (
        "Mean-field self-attention on the sphere (USA-AV)",
        "Without auxiliary variables the attractive USA dynamics collapses to a Dirac mass; "
        "positional (RoPE, phase fields, gauges) and prompt auxiliary variables make the "
        "maximiser spread along an orbit or over K clusters, attaining the maximal energy "
        "e^beta/(2 beta). Gauge kernels are exactly USA in the gauge frame.",
    ),
    "attention": (
        "Long-context attention scaling limits",
        "For n i.i.d. keys on S^{d-1}, softmax attention at inverse temperature beta has a critical "
        "scale beta ~ n^{2/(d-1)}: below it the ordered weights follow exp(-x^alpha) on a window of "
        "size C n beta^{-1/alpha}; at it they converge to a Poisson-process law; above it the top "
        "weight tends to 1. The attention output drifts along grad log rho - (d-1)/2 q.",
    ),
    "depth": (
        "Rank collapse through depth (Post-Norm versus Pre-Norm)",
        "Post-Norm stacks amplify token similarity through depth more than Pre-Norm ones; removing "
        "the prefix-averaging component of causal attention suppresses it; in training a Post-Norm "
        "run can collapse to the frequency loss (the entropy of the label frequencies).",
    ),
    "prototypes": (
        "Anti-collapse prototype readout",
        "The soft-assignment loss decomposes exactly as L_q = L_OLS + V with V >= 0 a prototype "
        "variance that pushes prototypes apart; with two-timescale training (eps = eta_theta/eta_P "
        "small) soft prototypes keep the whole codebook in use, unlike hard vector quantisation.",
    ),
    "continuum": (
        "The mean-field limit: dispersion relation and metastable clusters",
        "As n -> infinity the particles' law solves a continuity equation on the sphere. Around the uniform "
        "law the degree-l harmonic grows at the rate lambda_l = l(l+d-2) Gamma(d/2) 2^{d/2-1} beta^{-d/2} "
        "I_{l+d/2-1}(beta) (Funk-Hecke), measured here from a spectral density solver and from particles; the "
        "fastest mode k* ~ sqrt(2 beta) predicts how many clusters form before the slow merging phase, and the "
        "particles converge to the density at the rate n^{-1/2}.",
    ),
    "dynamics": (
        "Attention variants as dynamics: normalisation schemes, heads, masks, Sinkhorn and hardmax",
        "With Q = K = V = I an equiangular start stays equiangular and its inner product (and the common "
        "radius) solves a scalar ODE for each layer-norm placement (Post-, Pre-, Mix-, Peri-LN, nGPT, "
        "LN-scaling); from random starts every scheme collapses to one cluster, 1 - rho decaying like "
        "e^{-2t} (Post-LN), e^{-2 alpha t} (nGPT), e^{-4 sqrt t} (LN-scaling) and t^{-2} (Pre-, Mix-, "
        "Peri-LN, whose radius grows like t); simuformer's Post-LN and nGPT steps are meanfield's "
        "renormalised Euler steps; under a causal mask the first token never moves and all tokens converge to it; ALiBi causal "
        "attention on the circle favours the ends of the sequence at early times (a U-shaped response, "
        "lost in the middle) and becomes monotone after a critical time; Sinkhorn attention is doubly "
        "stochastic and, for symmetric weights, a gradient flow of the entropic self-transport cost; hardmax "
        "attention freezes the leaders and comes to rest at a clustered equilibrium.",
    ),
    "noise": (
        "Noise and natural frequencies: stochastic attention dynamics and the Kuramoto model",
        "Under independent noise a free token is Brownian motion on the sphere, E<x(t), x(0)> = "
        "exp(-(d-1) sigma^2 t/2); the projected Stratonovich Heun step has strong order 1/2 and weak "
        "order 1; the noisy Kuramoto model loses its uniform state at K_c = d sigma^2/2 (the degree-1 "
        "rate K(d-1)/d - (d-1) sigma^2/2) and settles at r = A_d(2Kr/sigma^2); with Lorentzian "
        "frequencies Ott-Antonsen's r = sqrt(1 - 2 gamma/K); under common noise the lines of two tokens "
        "merge at the rate lambda_1 - lambda_2 = sigma^2 of the linear flow dX = sigma dB o X, a pair "
        "ending at +1 with probability 1 - theta_0/pi.",
    ),
}


def _fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "**NO**"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def tolerance_text(row: Mapping[str, Any]) -> str:
    """A check's tolerance as the report shows it: its kind and rule, e.g. ``relative:
    |measured - theory| <= 0.05 |theory|`` or ``qualitative: measured > 0``."""
    kind, rule = tolerance_rule(row)
    return f"{kind}: {rule}"


def total_seconds(summary: Mapping[str, Any]) -> float | None:
    """The experiment's time: ``timings.total_s`` (set by ``run_experiments``), else the sum of its
    timed parts, else None."""
    timings = summary.get("timings", {}) or {}
    if isinstance(timings.get("total_s"), (int, float)):
        return float(timings["total_s"])
    parts = [v for v in timings.values() if isinstance(v, (int, float))]
    return float(sum(parts)) if parts else None


def _seconds(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f} s" if v < 120 else f"{v / 60:.1f} min"


def _summary_rows(summaries: Mapping[str, Any]) -> list[tuple[str, int, int, str]]:
    """The summary table's rows: experiment, checks passed, checks, time (both report formats)."""
    return [
        (
            name,
            sum(bool(c["pass"]) for c in s["checks"]),
            len(s["checks"]),
            _seconds(total_seconds(s)),
        )
        for name, s in summaries.items()
    ]


def _anchor(name: str) -> str:
    return "exp-" + "".join(ch if ch.isalnum() else "-" for ch in name)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(
    out_dir: str | os.PathLike[str], summaries: Mapping[str, Mapping[str, Any]], *, quick: bool
) -> Path:
    """Write ``REPORT.md`` and ``report.html`` from the experiments' summaries.

    On top: the failing checks, then a table of the experiments (checks passed / total, time, each
    linking its section). Each section: the claim, its figures, the table of checks (name, theory,
    measured, tolerance with its kind, pass, the note's first sentence) and the notes in full
    (folded: ``<details>``), the settings and the time of each part.
    """
    out = Path(out_dir)
    failing = [
        (name, c["name"]) for name, s in summaries.items() for c in s["checks"] if not c["pass"]
    ]
    total = sum(len(s["checks"]) for s in summaries.values())
    md = ["# meanfield reproduction report", ""]
    md.append(
        f"Mode: {'quick' if quick else 'full'}. Python {platform.python_version()} on {platform.machine()}."
    )
    md.append("")
    if failing:
        md.append(
            f"**{len(failing)} of {total} checks FAIL:** "
            + ", ".join(f"{e}/{c}" for e, c in failing)
        )
    else:
        md.append(f"All {total} checks pass.")
    md += ["", "| experiment | checks passed | time |", "|---|---|---|"]
    for name, n_pass, n_checks, seconds in _summary_rows(summaries):
        mark = "" if n_pass == n_checks else " **FAIL**"
        md.append(f"| [{name}](#{_anchor(name)}) | {n_pass} / {n_checks}{mark} | {seconds} |")
    md.append("")
    for name, s in summaries.items():
        title, claim = _CLAIMS.get(name, (name, ""))
        md += [f'<a id="{_anchor(name)}"></a>', "", f"## {title} (`{name}`)", "", claim, ""]
        timings = s.get("timings", {})
        md.append(
            "Time: "
            + ", ".join(f"{k} {v:g} s" for k, v in timings.items() if isinstance(v, (int, float)))
        )
        md.append("")
        figures = s.get("figures", [])
        for fig in figures:
            md.append(f"![{fig}]({name}/{fig})")
            md.append("")
        if not figures:
            md += ["(no figure)", ""]
        md.append("| check | theory | measured | tolerance | pass | note |")
        md.append("|---|---|---|---|---|---|")
        details = []
        for c in s["checks"]:
            head, rest = first_sentence(c.get("note", ""))
            if rest:
                details.append(f"- `{c['name']}`: {' '.join(c['note'].split())}")
                head += f" [more](#{_anchor(name)}-notes)"
            md.append(
                f"| `{c['name']}` | {_fmt(c['theory'])} | {_fmt(c['measured'])} | "
                f"{_md_cell(tolerance_text(c))} | {_fmt(c['pass'])} | {_md_cell(head)} |"
            )
        if details:
            md += [
                "",
                f'<a id="{_anchor(name)}-notes"></a>',
                "<details><summary>notes in full</summary>",
                "",
                *details,
                "",
                "</details>",
            ]
        md += [
            "",
            "<details><summary>settings</summary>",
            "",
            "```json",
            json.dumps(s.get("settings", {}), indent=1, default=str)[:20000],
            "```",
            "",
            "</details>",
            "",
        ]
    _paths.write_output(out / "REPORT.md", "\n".join(md), "report")
    _paths.write_output(out / "report.html", _html(out, summaries, quick, failing, total), "report")
    return out / "REPORT.md"


def _html(
    out: Path,
    summaries: Mapping[str, Mapping[str, Any]],
    quick: bool,
    failing: list[tuple[str, str]],
    total: int,
) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>meanfield report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}.fail{background:#fdd}"
        "img{max-width:100%}details summary{cursor:pointer;color:#555}</style>",
        "</head><body><h1>meanfield reproduction report</h1>",
        f"<p>Mode: {'quick' if quick else 'full'}.</p>",
    ]
    if failing:
        parts.append(
            f"<p class='fail'><b>{len(failing)} of {total} checks FAIL:</b> "
            + html.escape(", ".join(f"{e}/{c}" for e, c in failing))
            + "</p>"
        )
    else:
        parts.append(f"<p>All {total} checks pass.</p>")
    parts.append(
        "<table class='summary'><tr><th>experiment</th><th>checks passed</th><th>time</th></tr>"
    )
    for name, n_pass, n_checks, seconds in _summary_rows(summaries):
        cls = "" if n_pass == n_checks else " class='fail'"
        parts.append(
            f"<tr{cls}><td><a href='#{_anchor(name)}'>{html.escape(name)}</a></td>"
            f"<td>{n_pass} / {n_checks}</td><td>{seconds}</td></tr>"
        )
    parts.append("</table>")
    for name, s in summaries.items():
        title, claim = _CLAIMS.get(name, (name, ""))
        parts.append(
            f"<h2 id='{_anchor(name)}'>{html.escape(title)}</h2><p>{html.escape(claim)}</p>"
        )
        for fig in s.get("figures", []):
            p = out / name / fig
            if p.exists():
                b64 = base64.b64encode(p.read_bytes()).decode()
                parts.append(
                    f"<p><img alt='{html.escape(fig)}' src='data:image/png;base64,{b64}'></p>"
                )
        parts.append(
            "<table><tr><th>check</th><th>theory</th><th>measured</th><th>tolerance</th><th>pass</th><th>note</th></tr>"
        )
        for c in s["checks"]:
            cls = "" if c["pass"] else " class='fail'"
            head, rest = first_sentence(c.get("note", ""))
            note = html.escape(head) + (
                f"<details><summary>details</summary>{html.escape(rest)}</details>" if rest else ""
            )
            parts.append(
                f"<tr{cls}><td>{html.escape(c['name'])}</td><td>{_fmt(c['theory'])}</td><td>{_fmt(c['measured'])}</td>"
                f"<td>{html.escape(tolerance_text(c))}</td><td>{'yes' if c['pass'] else 'NO'}</td><td>{note}</td></tr>"
            )
        parts.append("</table>")
        parts.append(
            "<details><summary>settings and timings</summary><pre>"
            + html.escape(
                json.dumps(
                    {"settings": s.get("settings"), "timings": s.get("timings")},
                    indent=1,
                    default=str,
                )[:20000]
            )
            + "</pre></details>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)
