"""bench.compare's figures: per-cell medians, the printed tables and the PNG chart.

Benchmark-only. Owns: turning measured rows (one per run) and failover trials into the cells
the report shows, and drawing them. Must never: measure or start anything; matplotlib is an
optional extra (``pip install '.[bench]'``), imported only to draw.
"""

from __future__ import annotations

import math
import statistics

from ._harness import percentile

WORKLOAD_TITLES = {
    "write": "fenced write",
    "acqrel": "acquire+release",
    "cycle": "acq+write+rel",
    "read": "linearizable read",
}
SYSTEMS = ("ours", "etcd")
# Each way our clients can call (bench.compare --ours-client) is a system of its own, beside
# etcd; "ours" is the raw stubs, the default.
OURS_SYSTEMS = ("ours", "ours-lib", "ours-mux")


def systems_of(rows: list[dict]) -> list[str]:
    """The systems measured, ours first (in OURS_SYSTEMS order), etcd last."""
    present = {r["system"] for r in rows}
    return [s for s in OURS_SYSTEMS if s in present] + ["etcd"]
CHART_HINT = "matplotlib is missing: pip install '.[bench]' (or -e '.[bench]') to draw the chart"


def _median(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def cells(rows: list[dict]) -> list[dict]:
    """One cell per (workload, clients): per system the medians over rounds, and the median
    over rounds of ours/etcd ops/s measured in the same round (the runs alternate)."""
    out = []
    keys = list(dict.fromkeys((r["workload"], r["clients"]) for r in rows))
    systems = systems_of(rows)
    for workload, clients in keys:
        mine = [r for r in rows if (r["workload"], r["clients"]) == (workload, clients)]
        cell = {"workload": workload, "clients": clients, "systems": systems}
        for system in systems:
            rs = [r for r in mine if r["system"] == system]
            cell[system] = {
                "runs": len(rs),
                "ops_per_s": _median(r["ops_per_s"] for r in rs),
                "ops_all": [round(r["ops_per_s"]) for r in rs],
                "p50_ms": _median(r["p50_ms"] for r in rs),
                "p99_ms": _median(r["p99_ms"] for r in rs),
                "server_cpu_ms_per_op": _median(r["server_cpu_ms_per_op"] for r in rs),
                "client_cpu_ms_per_op": _median(r["client_cpu_ms_per_op"] for r in rs),
                "errors": sum(sum(r["errors"].values()) + sum(r["setup_errors"].values()) for r in rs),
            }
        by_round = {}
        for r in mine:
            by_round.setdefault(r["round"], {})[r["system"]] = r["ops_per_s"]
        # Per ours-system: the median of its per-round ratios to etcd; "ratio"/"ratios" are
        # the first one's (the raw stubs' when they ran).
        cell["ratio_by_system"], cell["ratios_by_system"] = {}, {}
        for system in systems[:-1]:
            ratios = [d[system] / d["etcd"] for d in by_round.values() if system in d and d.get("etcd", 0) > 0]
            cell["ratio_by_system"][system] = _median(ratios)
            cell["ratios_by_system"][system] = [round(x, 2) for x in ratios]
        cell["ratio"] = cell["ratio_by_system"][systems[0]]
        cell["ratios"] = cell["ratios_by_system"][systems[0]]
        out.append(cell)
    return out


def failover_cells(trials: list[dict]) -> list[dict]:
    out = []
    systems = _failover_systems(trials)
    for kind in dict.fromkeys(t["kind"] for t in trials):
        for system in systems:
            secs = sorted(t["seconds"] for t in trials if t["kind"] == kind and t["system"] == system)
            ok = [s for s in secs if not math.isnan(s)]
            out.append({"kind": kind, "system": system, "trials": len(secs), "failed": len(secs) - len(ok),
                        "p50_ms": percentile(ok, 0.5) * 1000 if ok else float("nan"),
                        "max_ms": ok[-1] * 1000 if ok else float("nan"),
                        "min_ms": ok[0] * 1000 if ok else float("nan")})
    return out


def _failover_systems(rows: list[dict]) -> list[str]:
    """ours and etcd, with any other cluster of ours (--failover-b) between them."""
    others = [s for s in dict.fromkeys(r["system"] for r in rows) if s not in SYSTEMS]
    return [SYSTEMS[0], *others, SYSTEMS[1]]


def print_cells(cs: list[dict]) -> None:
    header = (f"{'workload':18s} {'clients':>7s} {'ours as':8s} {'ours/etcd':>9s}  {'ops/s ours':>10s} {'etcd':>7s}  "
              f"{'p50 ms ours':>11s} {'etcd':>6s}  {'p99 ms ours':>11s} {'etcd':>6s}  "
              f"{'CPU ms/op servers ours':>22s} {'etcd':>6s}  {'clients ours':>12s} {'etcd':>6s}  errors")
    print(header)
    print("-" * len(header))
    for c in cs:
        for system in c.get("systems", SYSTEMS)[:-1]:
            _print_line(c, system)


def _print_line(c: dict, system: str) -> None:
    o, e = c[system], c["etcd"]
    ratio = c.get("ratio_by_system", {}).get(system, c["ratio"])
    errors = f"{o['errors']}/{e['errors']}" if o["errors"] or e["errors"] else "-"
    print(f"{WORKLOAD_TITLES.get(c['workload'], c['workload']):18s} {c['clients']:7d} {system:8s} {ratio:9.2f}  "
          f"{o['ops_per_s']:10.0f} {e['ops_per_s']:7.0f}  {o['p50_ms']:11.2f} {e['p50_ms']:6.2f}  "
          f"{o['p99_ms']:11.2f} {e['p99_ms']:6.2f}  {o['server_cpu_ms_per_op']:22.3f} "
          f"{e['server_cpu_ms_per_op']:6.3f}  {o['client_cpu_ms_per_op']:12.3f} "
          f"{e['client_cpu_ms_per_op']:6.3f}  {errors}")


def print_failover(fs: list[dict]) -> None:
    header = f"{'leader':8s} {'system':6s} {'trials':>6s} {'p50 ms':>8s} {'max ms':>8s} {'min ms':>8s}  failed"
    print(header)
    print("-" * len(header))
    for f in fs:
        what = "SIGKILL" if f["kind"] == "kill" else "SIGSTOP"
        print(f"{what:8s} {f['system']:6s} {f['trials']:6d} {f['p50_ms']:8.0f} {f['max_ms']:8.0f} "
              f"{f['min_ms']:8.0f}  {f['failed'] or '-'}")


def chart(cs: list[dict], fs: list[dict], path: str, title: str) -> str | None:
    """Draw the PNG; returns None, or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: write the file only
        import matplotlib.pyplot as plt
    except ImportError:
        return CHART_HINT
    colors = {"ours": "#1f77b4", "ours-lib": "#17becf", "ours-mux": "#2ca02c", "ours-b": "#9467bd", "etcd": "#ff7f0e"}
    systems = cs[0].get("systems", list(SYSTEMS)) if cs else list(SYSTEMS)
    labels = [f"{WORKLOAD_TITLES.get(c['workload'], c['workload'])}\n{c['clients']} cl." for c in cs]
    xs = range(len(cs))
    width = 0.76 / len(systems)
    fig, axes = plt.subplots(3, 1, figsize=(max(10, 0.9 * len(cs) + 3), 13),
                             gridspec_kw={"height_ratios": [3, 2, 2]})
    ops, cpu, fail = axes
    for k, system in enumerate(systems):
        shift = (k - (len(systems) - 1) / 2) * width
        ops.bar([x + shift for x in xs], [c[system]["ops_per_s"] for c in cs], width, label=system,
                color=colors[system])
        server = [c[system]["server_cpu_ms_per_op"] for c in cs]
        client = [c[system]["client_cpu_ms_per_op"] for c in cs]
        cpu.bar([x + shift for x in xs], server, width, color=colors[system], label=f"{system} servers")
        cpu.bar([x + shift for x in xs], client, width, bottom=server, color=colors[system], alpha=0.45,
                hatch="//", label=f"{system} clients")
    for x, c in zip(xs, cs, strict=True):
        top = max(c[system]["ops_per_s"] for system in systems)
        if not math.isnan(c["ratio"]) and not math.isnan(top):
            label = " ".join(f"x{c.get('ratio_by_system', {}).get(s, c['ratio']):.2f}" for s in systems[:-1])
            ops.annotate(label, (x, top), ha="center", va="bottom", fontsize=8)
    ops.set_ylabel("ops/s (median of rounds)")
    ops.set_title(title + "\nlabel: ours/etcd ops/s, median of per-round ratios", fontsize=10)
    cpu.set_ylabel("CPU ms per op")
    for ax in (ops, cpu):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend(fontsize=8)
    kinds = list(dict.fromkeys(f["kind"] for f in fs))
    fail_systems = _failover_systems(fs)
    fail_width = 0.76 / len(fail_systems)
    for k, system in enumerate(fail_systems):
        mine = [next((f for f in fs if f["kind"] == kind and f["system"] == system), None) for kind in kinds]
        p50 = [f["p50_ms"] if f else float("nan") for f in mine]
        mx = [f["max_ms"] if f else float("nan") for f in mine]
        pos = [i + (k - (len(fail_systems) - 1) / 2) * fail_width for i in range(len(kinds))]
        fail.bar(pos, p50, fail_width, color=colors.get(system, "#7f7f7f"), label=f"{system} p50")
        fail.scatter(pos, mx, color="black", marker="_", s=300, zorder=3, label="max" if k == 0 else None)
    fail.set_xticks(range(len(kinds)))
    fail.set_xticklabels([f"leader {'SIGKILL' if k == 'kill' else 'SIGSTOP'}" for k in kinds])
    fail.set_ylabel("ms to next acquire + write")
    fail.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
