"""Ports chosen for servers started later: below the kernel's ephemeral range (where the kernel
picks outgoing connections' ports, which could take them first), free when chosen, and apart in
processes started together."""

from __future__ import annotations

import socket
from pathlib import Path

from kvtier.apps.ports import SPAN, free_port, free_ports_on


def _ephemeral() -> tuple[int, int]:
    first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return first, last


def test_ports_are_drawn_below_the_ephemeral_range() -> None:
    first, _ = _ephemeral()
    drawn = {free_port() for _ in range(50)}
    assert all(first - SPAN <= port < first for port in drawn), sorted(drawn)
    assert len(drawn) > 40  # drawn at random: servers started together rarely meet


def test_a_run_of_ports_is_free_and_below_the_range() -> None:
    first, _ = _ephemeral()
    start = free_ports_on("127.0.0.1", 4)
    assert first - SPAN <= start and start + 4 <= first
    for port in range(start, start + 4):
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))  # free: nothing raises
