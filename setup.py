"""The compiled parts of kvtier, both the proxy's per-decision work: the index's digests and
lookups (``kvtier/apps/proxy/_digests.c``) and kv-aware's passes over the fleet (``_scoring.c``).

Optional: where they cannot be built (no C compiler), the install goes on and the proxy does the
same in Python, slower (``prefix_index``, ``scoring``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            f"kvtier.apps.proxy.{name}",
            [f"kvtier/apps/proxy/{name}.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )  # fmt: skip
        for name in ("_digests", "_scoring")
    ]
)
