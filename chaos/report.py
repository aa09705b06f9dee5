"""Per-run report: ``summary.json`` and ``timeline.html`` (self-contained, inline SVG, no network).

The timeline: fault bands (inject -> heal), leader per node over time (dots colored by term),
acknowledged ops (green ticks) and refused / unknown ops (orange / grey ticks) per client process,
violations marked in red at the ops they name.
"""

from __future__ import annotations

import html
import itertools
import json
import os
import statistics
from typing import Any

from chaos.history import History


def _stats(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0, "p50": None, "max": None}
    return {"n": len(values), "p50": round(statistics.median(values), 3), "max": round(max(values), 3),
            "values": values}


def longest_ack_gap_s(history: History, start_ns: int, end_ns: int) -> float | None:
    """The longest stretch of ``[start_ns, end_ns]`` in which no operation was acknowledged.

    Issue "safe for the whole life of a deployment" bounds it for follower faults: a leader
    that keeps leading keeps acknowledging, so a follower's pause or partition shows as no gap
    beyond a couple of heartbeats. Ops are every client's ``ok`` answers (hostile and refused
    ones say nothing about availability). None for an empty or inverted window.
    """
    if end_ns <= start_ns:
        return None
    return longest_gap_s([op.complete_ns for op in history.ops if op.outcome == "ok" and op.complete_ns is not None],
                         start_ns, end_ns)


def longest_gap_s(ends_ns: list[int], since_ns: int, until_ns: int) -> float:
    """The longest time in [since, until] with none of ``ends_ns`` (acknowledgements) in it."""
    edges = [since_ns, *sorted(t for t in ends_ns if since_ns <= t <= until_ns), until_ns]
    return round(max(b - a for a, b in itertools.pairwise(edges)) / 1e9, 3)


def ack_gaps_by_fault(history: History, steps: list[dict]) -> dict[str, float | None]:
    """Per fault kind (the largest of its steps), the longest gap between acknowledgements from
    inject to heal; in the summary beside the leader changes, for the follower faults."""
    gaps: dict[str, float | None] = {}
    for step in steps:
        if "inject_t_ns" not in step or "heal_t_ns" not in step:
            continue
        gap = longest_ack_gap_s(history, step["inject_t_ns"], step["heal_t_ns"])
        step["longest_ack_gap_s"] = gap
        known = [g for g in (gaps.get(step["kind"]), gap) if g is not None]
        gaps[step["kind"]] = max(known) if known else None
    return gaps


def summarize(history: History, report, steps: list[dict], errors: list[str], final_info: dict, *, profile: str,
              seed: int, wall_s: float) -> dict[str, Any]:
    ops_by_outcome: dict[str, int] = {}
    for op in history.ops:
        ops_by_outcome[op.outcome] = ops_by_outcome.get(op.outcome, 0) + 1
    faults = [s["kind"] for s in steps]
    return {
        "profile": profile,
        "seed": seed,
        "wall_s": round(wall_s, 1),
        "faults_injected": faults,
        "fault_count": len(faults),
        "ops": len(history.ops),
        "ops_by_outcome": ops_by_outcome,
        "ops_by_f_outcome": report.summary.get("ops_by_f_outcome"),
        "violations": len(report.violations),
        "violations_by_kind": report.summary.get("violations_by_kind"),
        "violation_details": [v.detail for v in report.violations[:50]],
        # what the run exercised (issue "Deeper chaos"): a hazard never hit is a gap, not a pass
        "hazards": {**report.summary.get("hazards", {}),
                    "largest_segment": report.summary.get("linearizability", {}).get("largest_segment"),
                    "faults": {k: faults.count(k) for k in sorted(set(faults))}},
        "checker_warnings": report.warnings[:50],
        "checker_summary": report.summary,
        "failover_s": _stats([s.get("failover_s") for s in steps if "failover_s" in s]),
        "failover_missed": [s["kind"] for s in steps if "failover_s" in s and s["failover_s"] is None],
        "convergence_s": _stats([s.get("convergence_s") for s in steps]),
        # Terms a new leader took during each fault (0: the leader led through it in its term).
        "leader_changes_by_fault": {s["kind"]: s["leader_changes"] for s in steps if "leader_changes" in s},
        # Seconds without an acknowledged operation, inject to heal (a figure, not a check:
        # this machine's load moves it; compare the follower faults with 2x the heartbeat).
        "longest_ack_gap_by_fault_s": ack_gaps_by_fault(history, steps),
        "final_digest": final_info.get("digest"),
        "steps": steps,
        "errors": errors,
    }


def write_report(out_dir: str, history: History, report, steps, errors, final_info, *, profile, seed, wall_s) -> dict:
    summary = summarize(history, report, steps, errors, final_info, profile=profile, seed=seed, wall_s=wall_s)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, default=str)
    with open(os.path.join(out_dir, "timeline.html"), "w", encoding="utf-8") as f:
        f.write(timeline_html(history, report, summary))
    return summary


_TERM_COLORS = ["#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#2ca02c"]


def timeline_html(history: History, report, summary: dict) -> str:
    times = [op.invoke_ns for op in history.ops] + [s.t_ns for s in history.nodes] + [f.t_ns for f in history.faults]
    if not times:
        return "<html><body>empty history</body></html>"
    t0, t1 = min(times), max(times + [op.complete_ns or 0 for op in history.ops])
    span = max(1, t1 - t0)
    width, left = 1400, 120
    nodes = sorted({s.node for s in history.nodes})
    procs = sorted({op.process for op in history.ops})
    row_h = 22
    top = 40
    rows = {("node", n): top + i * row_h for i, n in enumerate(nodes)}
    base = top + len(nodes) * row_h + 20
    for i, p in enumerate(procs):
        rows[("proc", p)] = base + i * row_h
    height = base + len(procs) * row_h + 40

    def x(t: int) -> float:
        return left + (t - t0) / span * (width - left - 20)

    parts: list[str] = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                        f'font-family="sans-serif" font-size="11">']
    # fault bands
    open_faults: dict[str, int] = {}
    bands = []
    for f in sorted(history.faults, key=lambda f: f.t_ns):
        if f.action == "inject":
            open_faults[f.kind] = f.t_ns
        elif f.kind in open_faults:
            bands.append((f.kind, open_faults.pop(f.kind), f.t_ns))
    for kind, t in open_faults.items():
        bands.append((kind, t, t1))
    for k, (kind, a, b) in enumerate(bands):
        parts.append(f'<rect x="{x(a):.1f}" y="20" width="{max(2.0, x(b) - x(a)):.1f}" height="{height - 40}" '
                     f'fill="#ffcc00" opacity="0.18"><title>{html.escape(kind)}</title></rect>')
        parts.append(f'<text x="{x(a) + 2:.1f}" y="{14 + (k % 2) * 10}" fill="#8a6d00">{html.escape(kind)}</text>')
    # time axis
    for s in range(0, int(span / 1e9) + 1, max(1, int(span / 1e9 / 20))):
        xx = x(t0 + int(s * 1e9))
        parts.append(f'<line x1="{xx:.1f}" y1="{height - 30}" x2="{xx:.1f}" y2="{height - 25}" stroke="#999"/>')
        parts.append(f'<text x="{xx:.1f}" y="{height - 12}" text-anchor="middle" fill="#666">{s}s</text>')
    # node rows: leadership (filled, colored by term) and follower samples (small grey)
    for n in nodes:
        y = rows[("node", n)]
        parts.append(f'<text x="4" y="{y + 4}">{html.escape(n)}</text>')
        parts.append(f'<line x1="{left}" y1="{y}" x2="{width - 20}" y2="{y}" stroke="#eee"/>')
    last_leader = None
    for s in history.nodes:
        y = rows[("node", s.node)]
        if s.is_leader:
            color = _TERM_COLORS[s.term % len(_TERM_COLORS)]
            parts.append(f'<rect x="{x(s.t_ns):.1f}" y="{y - 6}" width="4" height="12" fill="{color}">'
                         f'<title>leader term {s.term}</title></rect>')
            if last_leader is not None and last_leader != (s.node, s.term):
                parts.append(f'<line x1="{x(s.t_ns):.1f}" y1="{top - 8}" x2="{x(s.t_ns):.1f}" y2="{base - 14}" '
                             f'stroke="#555" stroke-dasharray="2,2"><title>leader change: {html.escape(s.node)} '
                             f'term {s.term}</title></line>')
            last_leader = (s.node, s.term)
        else:
            parts.append(f'<circle cx="{x(s.t_ns):.1f}" cy="{y}" r="1.5" fill="#bbb"/>')
    # op rows
    colors = {"ok": "#2a9d3a", "refused": "#f08c00", "unknown": "#888"}
    for p in procs:
        y = rows[("proc", p)]
        parts.append(f'<text x="4" y="{y + 4}">{html.escape(p)}</text>')
    for op in history.ops:
        y = rows[("proc", op.process)]
        xa = x(op.invoke_ns)
        xb = x(op.complete_ns) if op.complete_ns else xa + 2
        dy = {"ok": -5, "refused": 0, "unknown": 5}[op.outcome]
        parts.append(f'<line x1="{xa:.1f}" y1="{y + dy}" x2="{max(xb, xa + 1):.1f}" y2="{y + dy}" '
                     f'stroke="{colors[op.outcome]}" stroke-width="3"/>')
    # violations
    for v in report.violations:
        for ref in v.ops:
            idx = ref.get("index")
            if idx is None or idx >= len(history.ops):
                continue
            op = history.ops[idx]
            y = rows[("proc", op.process)]
            parts.append(f'<circle cx="{x(op.invoke_ns):.1f}" cy="{y}" r="6" fill="none" stroke="red" stroke-width="2">'
                         f'<title>{html.escape(v.kind)}: {html.escape(v.detail[:300])}</title></circle>')
    parts.append("</svg>")
    head = {k: summary[k] for k in ("profile", "seed", "wall_s", "fault_count", "ops", "ops_by_outcome", "violations",
                                    "violations_by_kind", "failover_s", "convergence_s", "errors")}
    legend = ('<p>Yellow bands: faults (inject → heal). Node rows: colored bars = that node answered Status as leader '
              '(color = term), dashed line = leader change, grey dots = follower samples. Client rows: '
              '<span style="color:#2a9d3a">acknowledged</span>, <span style="color:#f08c00">refused</span>, '
              '<span style="color:#888">unknown</span> ops (invoke → complete). Red circles: violations.</p>')
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>chaos run</title></head><body>"
            f"<h2>chaos run: profile {html.escape(str(summary['profile']))}, seed {summary['seed']}, "
            f"{summary['violations']} violations</h2>{legend}<div style='overflow-x:auto'>{''.join(parts)}</div>"
            f"<pre>{html.escape(json.dumps(head, indent=2, default=str))}</pre></body></html>")
