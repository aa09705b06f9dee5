"""``python -m chaos run --profile ci [--out DIR]`` / ``--profile soak --minutes N [--seed S] [--only KINDS]``;
``python -m chaos check HISTORY.jsonl`` runs the checker alone. Exit 0 iff no violations (and no
harness errors such as a cluster that did not converge after heal)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a chaos profile against three real fencingd processes")
    r.add_argument("--profile", choices=["ci", "soak"], default="ci")
    r.add_argument("--out", default=None, help="run directory (default chaos-runs/<profile>-<time>)")
    r.add_argument("--seed", type=int, default=None, help="soak: the same seed replays the fault schedule")
    r.add_argument("--minutes", type=float, default=30.0, help="soak duration")
    r.add_argument("--only", default="", metavar="KINDS",
                   help="soak: only these fault kinds or kind prefixes, comma-separated (disk_loss,pause_leader)")
    c = sub.add_parser("check", help="check a recorded history")
    c.add_argument("history")
    args = p.parse_args(argv)
    if args.cmd == "check":
        from chaos import check

        return check.main([args.history])
    from chaos.netns_claim import PacketFiltersBusy
    from chaos.runner import OutDirInUse, run_profile, unmatched_only
    from chaos.small_fs import SmallFsError

    # Arguments first, so a typo is reported the same way with or without root.
    only = frozenset(k.strip() for k in args.only.split(",") if k.strip())
    if only and args.profile != "soak":
        print("chaos run: --only applies to --profile soak (the ci profile runs every kind once)", file=sys.stderr)
        return 2
    bad = unmatched_only(only)
    if bad:
        print(f"chaos run: --only: no soak fault kind starts with {', '.join(bad)}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("chaos run needs root (nft rules, SIGSTOP of processes)", file=sys.stderr)
        return 2
    out = args.out or os.path.join("chaos-runs", f"{args.profile}-{time.strftime('%Y%m%d-%H%M%S')}")

    try:
        code, summary = run_profile(args.profile, out, seed=args.seed, minutes=args.minutes, only=only)
    except (OutDirInUse, PacketFiltersBusy, ValueError) as exc:
        print(f"chaos run: {exc}", file=sys.stderr)
        return 2
    except SmallFsError as exc:  # no loop devices here, or no mkfs.ext4
        print(f"chaos run: cannot mount the members' small data filesystems: {exc}", file=sys.stderr)
        return 2
    brief = {k: summary[k] for k in ("profile", "seed", "wall_s", "fault_count", "ops", "ops_by_outcome",
                                     "violations", "violations_by_kind", "errors", "hazards")}
    brief["failover_s"] = {k: v for k, v in summary["failover_s"].items() if k != "values"}
    brief["convergence_s"] = {k: v for k, v in summary["convergence_s"].items() if k != "values"}
    brief["leader_changes_by_fault"] = summary["leader_changes_by_fault"]
    brief["longest_ack_gap_by_fault_s"] = summary["longest_ack_gap_by_fault_s"]
    print(json.dumps(brief, indent=2))
    print(f"[chaos] report: {os.path.join(out, 'summary.json')}  {os.path.join(out, 'timeline.html')}")
    return code


if __name__ == "__main__":
    sys.exit(main())
