"""``kvtier bench fleet``: where ``kvtier proxy`` sends requests, and what that saves.

command  its arguments     run  both halves
real/    two ``kvtier serve`` engines behind the proxy, each policy on two workloads
sim/     the proxy's own index and scorer over simulated fleets
"""
