"""``kvtier bench fleet``'s simulated half.

run  every size and policy     loop  FleetSim     engine  SimEngine     trace  the traces
stats  percentiles, sizes     report  goals, table, PNG, Markdown
"""
