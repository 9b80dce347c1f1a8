"""``kvtier bench concurrency``: what kvtier costs where it cannot help, at high concurrency.

command  its arguments     run  both parts, their verdicts     rounds  engines side by side
served   a long miss through servers     null_connector  the bound     vllm_alone  vLLM's
server without a connector     report  PNG, Markdown
"""
