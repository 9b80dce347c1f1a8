"""Mutual HMAC-SHA256 challenge-response, first thing on every connection.

    server -> CHALLENGE {version, nonce_s}
    client -> ANSWER    {nonce_c, identity, proof_c}
    server -> ACCEPT    {proof_s}    or REFUSAL {reason}, then close

    proof_c = HMAC-SHA256(secret, "kvtier-transfer client\0" | nonce_s | nonce_c | identity)
    proof_s = HMAC-SHA256(secret, "kvtier-transfer server\0" | nonce_c | nonce_s)

The server checks the client's proof (``hmac.compare_digest``) before it looks at the identity,
then compares identities field by field; the client checks the server's proof, so a peer that does
not hold the secret can neither read blocks nor feed the client data. Both proofs carry a role
label and fresh nonces from both sides: neither can be replayed nor reflected. Timeouts are the
socket's (set by the caller before the handshake).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
from typing import TypeVar

import msgspec

from kvtier.tiers.peer.net import wire
from kvtier.tiers.peer.net.base import PeerIdentity

NONCE_BYTES = 32
MIN_SECRET_BYTES = 16

M = TypeVar("M", bound=msgspec.Struct)


class HandshakeFailed(Exception):
    """The handshake did not complete; ``reason`` says why, ``auth`` whether the proof failed."""

    def __init__(self, reason: str, *, auth: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.auth = auth


def check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def serve_handshake(sock: socket.socket, secret: bytes, identity: PeerIdentity) -> PeerIdentity:
    """Server side; returns the client's identity. Raises ``HandshakeFailed`` on a wrong proof
    or identity (the caller sends the REFUSAL), ``wire.FrameError`` on malformed frames."""
    nonce = os.urandom(NONCE_BYTES)
    wire.send_control(sock, wire.Challenge(wire.VERSION, nonce))
    answer = wire.recv_message(sock)
    if not isinstance(answer, wire.Answer):
        raise wire.FrameError(f"expected ANSWER, got {type(answer).__name__}")
    try:
        peer = PeerIdentity(tuple(answer.identity))
    except ValueError as e:
        raise wire.FrameError(str(e)) from None
    expected = _client_proof(secret, nonce, answer.nonce, peer)
    if not hmac.compare_digest(answer.proof, expected):
        raise HandshakeFailed("authentication failed", auth=True)
    differences = peer.differences(identity)
    if differences:
        reason = "identity differs (client != server): " + "; ".join(differences)
        raise HandshakeFailed(reason)
    wire.send_control(sock, wire.Accept(_server_proof(secret, answer.nonce, nonce)))
    return peer


def open_handshake(sock: socket.socket, secret: bytes, identity: PeerIdentity) -> None:
    """Client side; raises ``HandshakeFailed`` when refused or when the server's proof is wrong."""
    challenge = _expect(sock, wire.Challenge)
    if challenge.version != wire.VERSION:
        raise HandshakeFailed(f"protocol version {challenge.version}, expected {wire.VERSION}")
    nonce = os.urandom(NONCE_BYTES)
    proof = _client_proof(secret, challenge.nonce, nonce, identity)
    wire.send_control(sock, wire.Answer(nonce, list(identity.fields), proof))
    accept = _expect(sock, wire.Accept)
    if not hmac.compare_digest(accept.proof, _server_proof(secret, nonce, challenge.nonce)):
        raise HandshakeFailed("authentication failed (the server's proof is wrong)", auth=True)


def _expect(sock: socket.socket, cls: type[M]) -> M:
    try:
        message = wire.recv_message(sock)
    except wire.FrameError as e:
        raise HandshakeFailed(f"bad handshake frame: {e}") from None
    if isinstance(message, wire.Refusal):
        raise HandshakeFailed(f"refused: {message.reason}", auth="authentication" in message.reason)
    if not isinstance(message, cls):
        raise HandshakeFailed(f"expected {cls.__name__}, got {type(message).__name__}")
    return message


def _client_proof(
    secret: bytes, server_nonce: bytes, client_nonce: bytes, identity: PeerIdentity
) -> bytes:
    fields = msgspec.msgpack.encode([list(field) for field in identity.fields])
    message = b"kvtier-transfer client\0" + server_nonce + client_nonce + fields
    return hmac.new(secret, message, hashlib.sha256).digest()


def _server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    message = b"kvtier-transfer server\0" + client_nonce + server_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()
