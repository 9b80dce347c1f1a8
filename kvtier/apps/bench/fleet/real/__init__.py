"""``kvtier bench fleet``'s real half.

run  the policies, the summary     fleet  the engines, one policy's run     chat  a
multi-round chat against an OpenAI endpoint     report  table, PNG, Markdown
"""
