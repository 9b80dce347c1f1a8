"""``kvtier bench scheduler``: the scheduler half's cost per engine step / a bare loop.

command  its arguments     run  the modes and sizes     sim  an engine's steps, simulated
vllm_adapter  the steps as vLLM's SchedulerOutput     report  table, PNG, Markdown
"""
