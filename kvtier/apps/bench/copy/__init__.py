"""``kvtier bench copy``: host-tier store and load throughput / a plain torch copy.

command  its arguments      run  the benchmark      report  table, PNG, Markdown
"""
