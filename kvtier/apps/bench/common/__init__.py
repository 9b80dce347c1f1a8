"""What every benchmark shares, written once.

engine_env    the environment vLLM runs in (in-process engines, servers)
connector     ``kv_transfer_config`` for kvtier and for vLLM's ExampleConnector
models        a ``--model`` argument: a local model's name or its directory
ports         free TCP ports on 127.0.0.1
servers       ``kvtier serve`` and ``kvtier proxy`` processes
redis_server  redis-server / valkey-server processes, one or a cluster
page_cache    dropping and measuring files' page cache
timing        a call's seconds, medians, the load of other work
ratios        paired ratios, their spread, goals
machine       what the JSON says of the machine
results       the JSON document and, beside it, its Markdown page (``markdown``)
plots         matplotlib without a display; saving a figure
loopback      the network bound: one raw TCP stream on 127.0.0.1
jobs          transfer jobs outside an engine; the bench model's KV tensors
"""
