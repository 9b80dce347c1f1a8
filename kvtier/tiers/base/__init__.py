"""The contracts every tier and both halves of kvtier share, below both.

spec.py           TierSpec: a tier's names, config section and builders; the contexts
index.py          the scheduler half's index of a tier (one contract for every tier)
results.py        the small typed results of the indexes
handler.py        TransferHandler: moves bytes between two media, jobs by id
job_thread.py     JobThread: a handler's jobs on a thread, in order (keyed_threads.py)
chunk_plan.py     which engine block goes to which chunk sub-block (the chunk arithmetic)
chunk_tier.py     ChunkTier: a tier of whole chunk records, as one rank reads and writes it
chunk_format.py   a chunk's verified record on disk (and in Redis)
chunk_io.py       the load and write handlers of any ChunkTier
"""
