"""``kvtier bench chaos``: a fleet under steady load while its parts fail (issue 39).

command    its arguments               settings   ChaosSettings: the run, the full and short forms
cluster    Redis, the engines, the proxies (and a prefill→decode pair), each started again on
           its port
schedule   the seeded faults: kinds, targets, quiet gaps, holds
faults     the injector: each fault done to the cluster, its timeline recorded
workload   a multi-round chat and long documents, in tokens
client     one request as the OpenAI SDK sends it: a Record
load       the open loop: a steady rate, a bound on those in flight
memory     every process's RSS (its process group), sampled
reference  every distinct prompt asked of one engine without kvtier
phases     steady, during a fault, after it: TTFT, served share, recovery
summarize  the JSON document: counts, phases, memory, verdicts against issue 39's acceptance
report     the printed table, the PNG timeline, the Markdown page
run        all of it, in order
"""
