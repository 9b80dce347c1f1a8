"""``on_stream(stream)``: ``with torch.cuda.stream(stream)`` in fewer calls, for a job's submit.

torch's stream context looks the current device up twice through its general lookup (given no
device), which cost a host job's submit on the H200's host tens of microseconds a lookup
(``kvtier bench gpu``'s ``submit_profile``: ``_get_device_index``), and the device waits for
the submit to end before it copies. Here the current stream of the stream's own device is asked
for by index, the stream is set, and the former one is set back after (``call_us`` times both
ways: ``stream_context``, ``on_stream``). A thread whose current device is another device (none
of kvtier's: ``bind_thread``; nor the engine's) gets torch's context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def on_stream(stream: torch.cuda.Stream) -> Iterator[None]:
    index = stream.device_index
    if torch.cuda.current_device() != index:
        with torch.cuda.stream(stream):
            yield
        return
    former = torch.cuda.current_stream(index)
    torch.cuda.set_stream(stream)
    try:
        yield
    finally:
        torch.cuda.set_stream(former)
