"""``kvtier demo``'s output: the round table, where the prompts' KV came from, the plot.

print_report(console, results)   the per-round table, a summary, the provenance table
plot(results, path)              TTFT and the share served from kvtier, per round (PNG)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from kvtier.apps.provenance_report import provenance_table

if TYPE_CHECKING:
    from kvtier.apps.demo import RoundResult


def print_report(console: Console, results: list[RoundResult]) -> None:
    table = Table(title="chat rounds; the engine's prefix cache is emptied between rounds")
    columns = ("round", "prompt\ntokens", "TTFT ms\nwithout", "TTFT ms\nkvtier", "TTFT\nratio",
               "tokens from\nkvtier", "hit\nrate", "outputs\nidentical")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.round), str(r.prompt_tokens), f"{r.ttft_s_without * 1e3:.1f}",
            f"{r.ttft_s_with * 1e3:.1f}", f"{r.ttft_ratio:.2f}", str(r.served_tokens),
            f"{r.hit_rate:.0%}", "[green]✓" if r.identical else "[red]✗",
        )  # fmt: skip
    console.print(table)
    served = sum(r.served_tokens for r in results)
    uncached = sum(r.uncached_tokens for r in results)
    later = results[1:] or results  # round 0 has nothing to reuse yet
    ratio = sum(r.ttft_ratio for r in later) / len(later)
    span = f"{later[0].round}-{later[-1].round}" if len(later) > 1 else str(later[0].round)
    console.print(
        f"from kvtier: {served} of the {uncached} prompt tokens beyond the engine's own cache "
        f"({served / uncached if uncached else 0:.0%})\n"
        f"TTFT with kvtier / without, mean of rounds {span}: {ratio:.2f}"
    )
    bad = [r.round for r in results if not r.identical]
    if bad:
        console.print(f"[red]✗ outputs with kvtier differ from those without it in rounds {bad}")
    else:
        console.print("[green]✓[/] outputs with kvtier identical to those without it (greedy)")
    rows = [(f"round {r.round}", r.provenance) for r in results]
    console.print(provenance_table("where each round's prompt KV came from (with kvtier)", rows))


def plot(results: list[RoundResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r.round for r in results]
    figure, (ttft, hits) = plt.subplots(1, 2, figsize=(9, 3.2))
    ttft.plot(rounds, [r.ttft_s_without * 1e3 for r in results], marker="o", label="without")
    ttft.plot(rounds, [r.ttft_s_with * 1e3 for r in results], marker="o", label="with kvtier")
    ttft.set(xlabel="round", ylabel="mean TTFT (ms)", title="time to first token")
    ttft.set_ylim(bottom=0)
    ttft.legend()
    hits.bar(rounds, [r.hit_rate for r in results], color="tab:green")
    hits.set(xlabel="round", ylabel="share of uncached tokens", title="served from kvtier")
    hits.set_ylim(0, 1)
    for axes in (ttft, hits):
        axes.set_xticks(rounds)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
