"""``kvtier bench transfer``: prefill→decode pulls / raw TCP, and TTFT through ``kvtier proxy``.

command  its arguments     run  the pulls     peer  the prefill process, the bench engine
mooncake  the optional comparator     report  table, PNG, Markdown
ttft     the TTFT split (the driver's peer tier)     ttft_report  its line, PNG, Markdown
"""
