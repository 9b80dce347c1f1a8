"""The provenance table: completions' ``kv_transfer_params`` summed and shown per row."""

from __future__ import annotations

from rich.console import Console

from kvtier.apps.provenance_report import ProvenanceTotals, add_up, provenance_table


def _params(engine: int, computed: int, load_ms: float, **tiers: int) -> dict[str, object]:
    """A completion's kv_transfer_params, with a count for each configured tier."""
    prompt = engine + sum(tiers.values()) + computed
    found = {"prompt_tokens": prompt, "engine_cached_tokens": engine, **tiers}
    return {"kvtier": found | {"failed_tokens": 0, "computed": computed, "load_ms": load_ms}}


def test_completions_add_up_and_others_are_skipped() -> None:
    params = [_params(64, 8, 1.5, cpu=128, disk=0), None, {"x": 1}, _params(0, 4, 2.5, disk=96)]
    assert add_up(params) == ProvenanceTotals(2, 300, 64, {"cpu": 128, "disk": 96}, 0, 12, 4.0)


def test_the_table_shows_each_sources_share_of_the_prompt_tokens() -> None:
    rows = [("round 0", add_up([_params(0, 200, 0.0, cpu=0)])),
            ("round 1", add_up([_params(100, 100, 3.0, cpu=300)]))]  # fmt: skip
    console = Console(width=120, record=True)
    console.print(provenance_table("where the KV came from", rows))
    text = console.export_text()
    assert "host" in text and "disk" not in text  # the configured tiers only
    round_1 = next(line for line in text.splitlines() if "round 1" in line)
    for cell in ("500", "100 (20%)", "300 (60%)", "3.00"):
        assert cell in round_1


def test_tokens_computed_instead_of_loaded_add_up_and_get_a_column() -> None:
    declined = _params(0, 200, 0.0, cpu=64)
    declined["kvtier"]["declined"] = {"redis": 128}  # type: ignore[index]
    totals = add_up([declined, _params(0, 10, 1.0, cpu=0)])
    assert totals == ProvenanceTotals(2, 274, 0, {"cpu": 64}, 0, 210, 1.0, declined_tokens=128)
    console = Console(width=140, record=True)
    console.print(provenance_table("where the KV came from", [("round 0", totals)]))
    text = console.export_text()
    assert "instead" in text and "128 (47%)" in text
