"""``kvtier bench transfer --ttft``'s report: a line per prompt length, the PNG, the Markdown.

line(row, goal)       -> str       the length's split and its ratio to the bound
plot(rows, meta, path)             the bound's parts beside the TTFT through the proxy
summary(document)     -> Summary   ``transfer-ttft.md``: the split per length
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary, verdict


def line(row: Mapping[str, Any], goal: float) -> str:
    return (
        f"prefill→decode {row['prompt_tokens']} tokens: through the proxy "
        f"{row['proxy_s'] * 1e3:.1f} ms / (prefill {row['proxy_prefill_s'] * 1e3:.1f} + "
        f"transfer {row['proxy_transfer_s'] * 1e3:.1f} + 1.2 x step "
        f"{row['step_s'] * 1e3:.1f}) = {row['ratio']:.2f} (min {row['ratio_min']:.2f}, max "
        f"{row['ratio_max']:.2f}; goal <= {goal}: {'met' if row['passes'] else 'NOT met'}); "
        f"the decode's first token {row['first_s'] * 1e3:.1f} ms after a pull, "
        f"{row['own_first_s'] * 1e3:.1f} ms holding the KV already; through the proxy / "
        f"(prefill + that) = {row['ideal_ratio']:.2f}; on the decode engine B waited "
        f"{row['wait_after_pull_s'] * 1e3:.1f} ms beyond its pull and its first forward took "
        f"{row['forward_steps']:.2f} steps; the HTTP hops {row['hops_s'] * 1e3:.1f} ms"
    )


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    figure, axes = plots.pyplot().subplots(figsize=(8, 4.5))
    ticks = range(len(rows))
    bottom = [0.0] * len(rows)
    parts = (("proxy_prefill", 1.0, "prefill"), ("proxy_transfer", 1.0, "transfer"),
             ("step", 1.2, "1.2 x decode step"))  # fmt: skip
    for name, scale, label in parts:
        values = [row[f"{name}_s"] * scale * 1e3 for row in rows]
        axes.bar([t - 0.2 for t in ticks], values, 0.38, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    proxied = [row["proxy_s"] * 1e3 for row in rows]
    bars = axes.bar([t + 0.2 for t in ticks], proxied, 0.38, label="TTFT through the proxy")
    axes.bar_label(bars, [f"{row['ratio']:.2f}x" for row in rows], fontsize=8)
    axes.set_xticks(list(ticks), [f"{row['prompt_tokens']} tokens" for row in rows])
    axes.set_ylabel("milliseconds (median)")
    axes.set_title(f"prefill→decode TTFT split, {meta['model']} ({meta['dtype']}); "
                   f"goal: proxy <= the bound", fontsize=10)  # fmt: skip
    axes.legend(fontsize=8)
    plots.save(figure, path)


def summary(document: Mapping[str, Any]) -> Summary:
    def ms(row: Mapping[str, Any], name: str) -> str:
        return f"{row[f'{name}_s'] * 1e3:.1f}"

    rows = [
        (str(row["prompt_tokens"]), ms(row, "prefill"), ms(row, "transfer"), ms(row, "step"),
         ms(row, "proxy"), f"{row['ratio']:.2f} ({row['ratio_min']:.2f}–{row['ratio_max']:.2f})",
         f"{row['ideal_ratio']:.2f}", verdict(row["passes"]))
        for row in document["rows"]
    ]  # fmt: skip
    quick = document["model"] == "tiny"
    facts = (("model", f"{document['model']} ({document['dtype']}), {document['repeats']} "
              "fresh prompts per length"), ("goal", f"<= {document['goal']}: "
              f"{document['goal_text']}"))  # fmt: skip
    return Summary("kvtier bench transfer --ttft",
                   "kvtier bench transfer --ttft" + (" --quick" if quick else ""),
                   ("tokens", "prefill ms", "pull ms", "decode step ms", "through the proxy ms",
                    "÷ (prefill + pull + 1.2 step)", "÷ (prefill + first token holding the KV)",
                    "result"), rows, facts)  # fmt: skip
