"""The disk tier's config section (extra-config key ``disk``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.config_parse import (
    as_bool,
    keys,
    mapping,
    non_empty_str,
    optional,
    positive_int,
    positive_size,
    required,
)


@dataclass(frozen=True)
class DiskConfig:
    """The local-disk tier (extra-config key ``disk``).

    ``bytes`` is the disk budget. ``write_through`` stores every chunk on disk when it is stored
    in CPU memory; otherwise (write-back) a chunk reaches disk when evicted from CPU memory.
    ``readers``: chunk files a rank's load reads at once, each on a thread of its own (None: on
    a GPU one per four CPUs the process may run on, 1 to 4; on the CPU one;
    ``files.default_readers``).
    """

    path: str
    bytes: int
    write_through: bool = False
    readers: int | None = None

    def __post_init__(self) -> None:
        non_empty_str(self.path, "disk.path")
        positive_int(self.bytes, "disk.bytes")
        as_bool(self.write_through, "disk.write_through")
        if self.readers is not None:
            positive_int(self.readers, "disk.readers")

    @classmethod
    def from_mapping(cls, raw: object, key: str = "disk") -> DiskConfig:
        """Parse the ``disk`` mapping; ``path`` and ``bytes`` are required."""
        raw = mapping(raw, key, keys(cls))
        return cls(
            path=required(raw, key, "path", non_empty_str),
            bytes=required(raw, key, "bytes", positive_size),
            write_through=optional(raw, key, "write_through", as_bool, False),
            readers=optional(raw, key, "readers", positive_int, None),
        )
