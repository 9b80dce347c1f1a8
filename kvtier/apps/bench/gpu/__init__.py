"""``kvtier bench gpu``: kvtier's CUDA paths on one 4,096-token request, each against its bound.

For each shape (``shapes.py``: ``8b``, ``70b-tp8``, ``mla``, ``hybrid``, ``bench``; ``tiny`` for
the tests) a request in scattered engine blocks and scattered host slots (``request.py``):

    host_copy.py       host store and load per mechanism / one contiguous pinned copy
    prefill.py         host load time / the prefill of the same tokens (transformers' Llama)
    beside_compute.py  a bf16 matmul loop with stores, then loads, beside it / alone
    disk_load.py       disk-tier load, page cache warm and cold / read + one host->device copy
    redis_load.py      Redis-tier load / a raw loopback stream (a real redis-server)
    peer_pull.py       the decode side's pull / a raw TCP stream
    pinning_rate.py    the host tier's pinning rate, and the engine thread's wait for it

``figures.py`` holds the figures, their goals and the JSON document (written after every
measure, a failed one recording its error); ``run.py`` runs them, ``report.py`` prints the table
and draws the PNG, ``markdown.py`` writes ``gpu.md``. The same code runs with ``--device cpu``
(no pinning, no CUDA events), which is how its tests run it. Nothing here imports vLLM: the GPU
machine has none.
"""
