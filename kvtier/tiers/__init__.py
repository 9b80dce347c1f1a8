"""Where chunks live: one package per tier (``host``, ``disk``, ``redis``, ``peer``), each holding
its spec, its scheduler-side index and its worker-side I/O; ``base`` holds the contracts every
tier and both halves share; ``registry`` the known tiers in the chain's order.

Importing a tier's package imports its spec only (no torch, no implementation): the spec's
builders import the rest when a tier is built."""
