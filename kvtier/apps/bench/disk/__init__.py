"""``kvtier bench disk``: the disk tier / raw sequential I/O, and TTFT from disk.

command  its arguments     run  throughput and the whole run     ttft  TTFT (the driver)
report   table, PNG, Markdown
"""
