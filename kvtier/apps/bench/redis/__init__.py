"""``kvtier bench redis``: the Redis tier / redis-py and a raw TCP stream, and TTFT from Redis.

command  its arguments     run  the rounds      rig  one chunk size's three sides
ttft     TTFT (the driver)      report  table, PNG, Markdown
"""
