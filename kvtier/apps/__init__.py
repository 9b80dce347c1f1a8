"""kvtier's applications, apart from its core: the ``kvtier`` command (``cli.py``), ``serve``,
``proxy``, ``demo``, ``inspect``, the benchmarks (``bench/``) and the local models they use.
They may import vLLM; the core imports none of them."""
