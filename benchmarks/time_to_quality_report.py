"""time_to_quality.py's report: per architecture, each run's held-out loss curve against the best Trainer run's
final loss (Markdown tables on stdout), and every curve in one plot."""

from __future__ import annotations

import reporting
from mlm_curves import loss_at, time_to_reach


def report(curves: dict[str, list[tuple[float, float]]], kinds: dict[str, list[str]], args) -> None:
    """Per architecture, one table per precision of its Trainer runs (the equal-precision one first) against
    the best of them (each side at its own best learning rate): each run's final held-out loss, how far
    below the peer's it ends, and the time it needs to reach the peer's final loss."""
    kind = {name: kinds.get(name, ["bert", "transformers" if name.startswith("transformers") else "bertgpu"])
            for name in curves}  # fmt: skip
    archs = args.arch.split(",")  # the architectures asked for: their tables, and their curves in the plot
    curves = {name: points for name, points in curves.items() if kind[name][0] in archs}
    hlines = []
    for arch in dict.fromkeys(kind[name][0] for name in curves):
        runs = [name for name in curves if kind[name][0] == arch]
        sides = sorted({kind[n][1] for n in runs if kind[n][1].startswith("transformers")}, key=lambda s: "fp32" in s)
        for side in sides or [None]:
            peers = [n for n in runs if kind[n][1] == side]
            peer_name = min(peers, key=lambda n: curves[n][-1][1]) if peers else None
            peer = curves[peer_name] if peer_name else None
            hlines += [peer[-1][1]] if peer else []
            print(f"\n{arch}" + (f": against {peer_name}, the best of {len(peers)} Trainer run(s)" if peer else ""))
            print(
                f"| run | held-out MLM loss at the end | below the peer | at {args.budget:g} s of the command | "
                "time to the peer's final loss | ratio |"
            )
            print("| --- | --- | --- | --- | --- | --- |")
            target = peer[-1][1] if peer else None
            peer_time = time_to_reach(peer, target) if peer else None
            for name in runs:
                points = curves[name]
                reach = time_to_reach(points, target) if target is not None else None
                ratio = f"{peer_time / reach:.2f}x" if reach and peer_time else "not reached"
                below = f"{target - points[-1][1]:+.3f}" if target is not None else ""
                print(
                    f"| {name} | {points[-1][1]:.3f} (at {points[-1][0]:.0f} s) | {below} | "
                    f"{loss_at(points, args.budget):.3f} | "
                    f"{f'{reach:.0f} s' if reach else 'not reached'} | {ratio} |"
                )
    title = f"{args.model} ({args.arch}), vocab {args.vocab_size}, batch {args.batch}, seq {args.seq}"
    if reporting.plot_curves(curves, args.plot, "wall-clock seconds (2 CPU cores)", "held-out masked-token loss (nats)",
                          title, hlines):  # fmt: skip
        print(f"plot: {args.plot}")
