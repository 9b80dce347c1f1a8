"""``kvtier bench ttft`` and the TTFT driver every tier's TTFT bench runs on.

command     its arguments
run         the no-regret bench: engines side by side, hits and 0%-hit throughput
hits        the hit sequence per prompt;  throughput  the 0%-hit pairs
ratios      the no-regret goals;  report, plot  tables, Markdown, PNG
tier        TierTTFT: a tier's kvtier config section and what happens between the passes
driver      the passes: store, then load from the tier, each load checked (``load``)
results     TTFTResults, one for every TTFT bench; TierCheck
setup       Setup (what an engine of a run shares), Workload
engine      an in-process engine (EngineHost, on_engine);  process  one in a child
timing      a timed request, a served batch
"""
