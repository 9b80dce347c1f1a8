"""``kvtier bench faults``' PNG and Markdown, from its rows (one per setting).

plot(path, rows)                  faults injected and outputs compared per setting, and
                                  the wrong outputs
summary(document) -> Summary      ``faults.md``: per setting, and the totals
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import plots
from kvtier.apps.bench.common.markdown import Summary, cell


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    names = [row["setting"] for row in rows]
    figure, axis = plots.pyplot().subplots(figsize=(9, 4))
    x = range(len(rows))
    axis.bar([i - 0.2 for i in x], [row["faults_injected"] for row in rows], 0.4,
             label="faults injected")  # fmt: skip
    axis.bar([i + 0.2 for i in x], [row["outputs_compared"] / 10 for row in rows], 0.4,
             label="outputs compared / 10")  # fmt: skip
    for i, row in enumerate(rows):
        axis.annotate(f"{row['wrong_outputs']} wrong", (i, 0), ha="center", va="bottom",
                      fontsize=7, color="red" if row["wrong_outputs"] else "green")  # fmt: skip
    axis.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    axis.set_title("kvtier bench faults: outputs against the engine without kvtier")
    axis.legend()
    plots.save(figure, path, dpi=100)


def summary(document: Mapping[str, Any]) -> Summary:
    rows = [
        (row["setting"], str(row["engines"]), str(row["faults_injected"]),
         str(row["outputs_compared"]), f"**{row['wrong_outputs']}**" if row["wrong_outputs"]
         else "0", cell(row["served_after_fault_min"]), cell(row["served_after_fault_median"]))
        for row in document["rows"]
    ]  # fmt: skip
    counted = ("faults_injected", "outputs_compared", "wrong_outputs", "engines")
    totals = {key: sum(row[key] for row in document["rows"]) for key in counted}
    facts = (("totals", f"{totals['faults_injected']} faults injected, "
              f"{totals['outputs_compared']} outputs compared, {totals['wrong_outputs']} wrong "
              f"(goal 0), {totals['engines']} engines"),)  # fmt: skip
    command = f"kvtier bench faults --minutes {document['minutes']:g} --seed {document['seed']}"
    if document.get("examples", 4) != 4:
        command += " --quick"
    return Summary("kvtier bench faults", command,
                   ("setting", "engines", "faults", "outputs compared", "wrong",
                    "served after a fault: min", "median"), rows, facts)  # fmt: skip
