"""``kvtier bench concurrency``'s long miss: a document that fails names its server and carries
the end of the server's log (the log goes with the run's temporary directory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.apps.bench.common.servers import Server
from kvtier.apps.bench.concurrency.served import LOG_LINES, LongMiss, _round
from kvtier.apps.ports import free_port


def test_a_failed_document_names_its_server_and_tells_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "kvtier.log"
    log.write_text("".join(f"line {n}\n" for n in range(100)))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: refused
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    server = Server(url, log, process)
    with pytest.raises(RuntimeError, match="a document sent to") as raised:
        _round(server, [[1, 2, 3]] * 2, LongMiss(documents=2, pairs=1))
    message = str(raised.value)
    assert url in message and "kvtier.log" in message and "line 99" in message
    assert f"line {99 - LOG_LINES}\n" not in message and f"line {100 - LOG_LINES}" in message
