"""RedisStore: the one client of the Redis tier (a server or a Redis Cluster), for every thread.

    check()                           at start-up: reachable, credentials, TLS, cluster mode;
                                      ValueError naming the setting (``check.py``)
    exists(names)   -> [bool]         pipelined, one round trip per node
    set_many(items) -> [bool]         pipelined SETs (``PX`` with ``ttl_s``); a refused one
                                      (``-OOM``) is False
    delete(names)
    send_get(name, lane, size)        a GET sent now (of a value over 2 MiB, its pieces:
    read_get(ticket, into) -> T|None  ``pieces.py``); its reply read later, in order, by
                                      ``into(Bulk | Pieces)`` from the socket; None: absent

Each thread has its own connections (``connections.py``; one per node and lane: the
scheduler's lookup thread, a worker's load and write threads never share one). Commands run on
a connection of their own (lane -1); GETs on lanes 0.. , where replies wait in order: reading a
ticket drops the replies sent before it that nobody read. A Redis Cluster is routed by key slot;
a ``MOVED`` reply refreshes the slot map and the command is retried once (``ASK``: once at the
node named, after ``ASKING``). A Redis that refuses reads in pieces (an ACL without GETRANGE)
has every value read whole from then on, with a warning.

**Circuit breaker**: a connection error or timeout closes the thread's connections, raises
``RedisUnavailable`` and opens the breaker: for 0.5 s (doubling on each failure in a row, up to
30 s; a success resets it) every call raises ``RedisUnavailable`` at once without touching the
network. After the window one call tries (reconnecting); the others keep failing fast until it
succeeded. Every socket call is bounded by ``timeout_s``, connect included.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from kvtier.tiers.redis.breaker import Breaker, RedisUnavailable
from kvtier.tiers.redis.bulk import Ticket
from kvtier.tiers.redis.check import answers, check_node
from kvtier.tiers.redis.cluster import SlotMap, key_slot, redirect
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.conn import Connection, Value
from kvtier.tiers.redis.connections import ThreadConnections
from kvtier.tiers.redis.errors import AskError, AuthError, MovedError, RespError
from kvtier.tiers.redis.pieces import Reader, open_ticket, read_commands, refuses_pieces
from kvtier.tiers.redis.url import RedisAddress, parse_url

logger = logging.getLogger(__name__)

COMMANDS = -1  # the lane of commands whose replies are read at once
T = TypeVar("T")
Sizes = Sequence[int | None]  # values' expected bytes (None: unknown)

__all__ = ["RedisStore", "RedisUnavailable", "Ticket"]


class RedisStore:
    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        keys = ["redis.url", *["redis.seeds"] * len(config.seeds)]
        self.addresses = [parse_url(url, key, config.password_env)
                          for url, key in zip(config.urls, keys)]  # fmt: skip
        self.setting_names = keys
        self.breaker = Breaker(config.timeout_s * 2)
        self.slots = SlotMap()
        self.connections = ThreadConnections(config)
        self.pieces = True  # large values read in pieces (``pieces.py``), unless Redis refused

    @property
    def available(self) -> bool:
        """False while the circuit breaker is open."""
        return self.breaker.closed

    def describe(self) -> str:
        kind = "Redis Cluster" if self.config.cluster else "Redis"
        return f"{kind} at {', '.join(a.describe() for a in self.addresses)}"

    def check(self) -> None:
        """Connect to every URL once: ValueError naming the setting and the cause."""
        for address, key in zip(self.addresses, self.setting_names):
            check_node(address, key, self.config, self.connections.tls_for(address, checking=True))

    # ---- batched commands ------------------------------------------------------------------

    def exists(self, names: Sequence[bytes]) -> list[bool]:
        replies = self._guarded(lambda: self._commands(names, [[b"EXISTS", n] for n in names]))
        return [reply == 1 for reply in replies]

    def set_many(self, items: Sequence[tuple[bytes, Value]]) -> list[bool]:
        """SET each (name, value); False where Redis refused it (out of memory, an error)."""
        ttl = self.config.ttl_s
        px = [b"PX", b"%d" % max(1, round(ttl * 1000))] if ttl is not None else []
        commands: list[list[Value]] = [[b"SET", name, value, *px] for name, value in items]
        names = [name for name, _ in items]
        replies = self._guarded(lambda: self._commands(names, commands))
        return [reply == "OK" for reply in replies]

    def delete(self, names: Sequence[bytes]) -> None:
        self._guarded(lambda: self._commands(names, [[b"DEL", n] for n in names]))

    def _commands(self, names: Sequence[bytes], commands: Sequence[list[Value]]) -> list[Any]:
        """Replies to ``commands`` (command i about key ``names[i]``), one pipeline per node;
        a redirected one retried once. An error reply is returned, an AuthError raised."""
        targets = [(self._address(name), False) for name in names]
        replies = self._pipelines(targets, commands)
        again = [i for i, reply in enumerate(replies) if isinstance(reply, MovedError)]
        if again:
            if any(not isinstance(replies[i], AskError) for i in again):
                self.refresh_slots([replies[i] for i in again])
            retry = [redirect(replies[i], self._address(names[i])) for i in again]
            for i, reply in zip(again, self._pipelines(retry, [commands[i] for i in again])):
                if isinstance(reply, MovedError):
                    raise ConnectionError(f"Redis Cluster keeps redirecting: {reply}")
                replies[i] = reply
        return replies

    def _pipelines(
        self, targets: Sequence[tuple[RedisAddress, bool]], commands: Sequence[list[Value]]
    ) -> list[Any]:
        """Send each command to its (node, after ASKING?), all nodes at once, then read."""
        groups: dict[tuple[str, int], tuple[Connection, list[int]]] = {}
        for i, (address, _) in enumerate(targets):
            if address.node not in groups:
                groups[address.node] = (self.connection(address, COMMANDS), [])
            groups[address.node][1].append(i)
        for conn, positions in groups.values():
            sent: list[Sequence[Value]] = []
            for i in positions:
                sent += [[b"ASKING"], commands[i]] if targets[i][1] else [commands[i]]
            conn.send(sent)
        replies: list[Any] = [None] * len(commands)
        for conn, positions in groups.values():
            for i in positions:
                if targets[i][1]:
                    conn.read_reply()  # ASKING's +OK
                replies[i] = conn.read_reply()
                if isinstance(replies[i], AuthError):
                    raise replies[i]
        return replies

    # ---- pipelined GETs --------------------------------------------------------------------

    def send_get(self, name: bytes, lane: int = 0, size: int | None = None) -> Ticket:
        """Send the read of ``name``, a value of about ``size`` bytes (a large one in pieces,
        ``pieces.py``), on this thread's connection ``lane`` to its node."""
        return self.send_gets([name], lane, [size])[0]

    def send_gets(
        self, names: Sequence[bytes], lane: int = 0, sizes: Sizes | None = None
    ) -> list[Ticket]:
        """Send the read of every name (``send_get``) on this thread's connection ``lane`` to
        its node: one system call per node, not one per read. Tickets in ``names``' order."""
        return self._guarded(lambda: self._send_gets(names, lane, sizes or [None] * len(names)))

    def _send_gets(self, names: Sequence[bytes], lane: int, sizes: Sizes) -> list[Ticket]:
        groups: dict[tuple[str, int], tuple[Connection, list[int]]] = {}
        for i, name in enumerate(names):
            address = self._address(name)
            if address.node not in groups:
                groups[address.node] = (self.connection(address, lane), [])
            groups[address.node][1].append(i)
        tickets: list[Ticket | None] = [None] * len(names)
        for conn, positions in groups.values():
            reads = [read_commands(names[i], sizes[i] if self.pieces else None) for i in positions]
            conn.send([command for commands in reads for command in commands])
            for i, commands in zip(positions, reads):
                ticket = tickets[i] = Ticket(names[i], conn, lane, sizes[i], len(commands))
                conn.waiting.append(ticket)
        return [ticket for ticket in tickets if ticket is not None]

    def _send_redirected(
        self, name: bytes, lane: int, address: RedisAddress, asking: bool, size: int | None
    ) -> Ticket:
        conn = self.connection(address, lane)
        whole = asking or not self.pieces  # ASKING covers one command
        commands = read_commands(name, None if whole else size)
        if asking:
            conn.send([[b"ASKING"], *commands])
            conn.waiting.append(Ticket(name, conn, lane))  # ASKING's reply: dropped unread
        else:
            conn.send(commands)
        ticket = Ticket(name, conn, lane, size, len(commands))
        conn.waiting.append(ticket)
        return ticket

    def read_get(self, ticket: Ticket, into: Callable[[Reader], T]) -> T | None:
        """``into`` the value of ``ticket``'s read (None: the key is absent). ``into`` may raise
        (a ChunkError): the rest of the value is dropped, the connection stays in step."""
        return self._guarded(lambda: self._read_get(ticket, into, redirects=1))

    def _read_get(self, ticket: Ticket, into: Callable[[Reader], T], redirects: int) -> T | None:
        self.connections.touch()  # after a failure anywhere, old connections are closed first
        if ticket.dropped or ticket.conn.closed or ticket not in ticket.conn.waiting:
            ticket = self._send_gets([ticket.name], ticket.lane, [ticket.size])[0]
        try:
            value = open_ticket(ticket)
        except MovedError as moved:
            if not redirects:
                raise ConnectionError(f"Redis Cluster keeps redirecting: {moved}") from None
            if not isinstance(moved, AskError):
                self.refresh_slots([moved])
            node, asking = redirect(moved, self._address(ticket.name))
            retry = self._send_redirected(ticket.name, ticket.lane, node, asking, ticket.size)
            return self._read_get(retry, into, redirects - 1)
        except AuthError:
            raise
        except RespError as error:
            if ticket.replies == 1 or not refuses_pieces(error):
                return None  # refused (e.g. a busy script): a miss like an absent key
            return self._read_get(self._whole(ticket, error), into, redirects)
        if value is None:
            return None
        try:
            return into(value)
        except RespError:
            return None  # a later piece refused (its slot moved meanwhile): a miss
        finally:
            if not value.conn.closed:
                value.finish()

    def _whole(self, ticket: Ticket, refusal: RespError) -> Ticket:
        """Send ``ticket``'s read again whole, as every read from now on (pieces refused)."""
        if self.pieces:
            logger.warning("kvtier: Redis refused a record's read in pieces (%s): records are "
                           "read whole, slower from 8 MiB; allow GETRANGE", refusal)  # fmt: skip
        self.pieces = False
        return self._send_gets([ticket.name], ticket.lane, [None])[0]

    # ---- the breaker -----------------------------------------------------------------------

    def _guarded(self, call: Callable[[], T]) -> T:
        """``call()``, or RedisUnavailable: the breaker is open, or ``call`` failed (opens it)."""
        self.breaker.enter()
        try:
            result = call()
        except (OSError, AuthError) as error:
            self._failed(error)
        except BaseException:  # Redis answered (a ChunkError of a value, say)
            self.breaker.succeeded()
            raise
        self.breaker.succeeded()
        return result

    def _failed(self, error: BaseException) -> NoReturn:
        """Close this thread's connections, make the others drop theirs, open the breaker.

        Unless Redis was restarted: a connection it closed, on a breaker that saw no failure,
        is tried once more afresh (a ``PING``); if Redis answers, only this call was lost (a
        miss) and the next ones use new connections, instead of every call failing for the
        breaker's window while Redis is back."""
        self.connections.fail()
        if self._restarted(error):
            raise RedisUnavailable(f"Redis closed the connection ({type(error).__name__}: "
                                   f"{error}); reconnected") from error  # fmt: skip
        window = self.breaker.failed()
        if isinstance(error, RedisUnavailable):
            raise error
        raise RedisUnavailable(f"Redis unavailable ({type(error).__name__}: {error}); "
                               f"not asked for {window:.1f} s") from error  # fmt: skip

    def _restarted(self, error: BaseException) -> bool:
        """Whether ``error`` is a connection Redis closed (a restart) and Redis answers anew."""
        closed = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, EOFError)
        closed_text = "closed the connection" in str(error)
        if self.breaker.failures or not (isinstance(error, closed) or closed_text):
            return False
        address = self.addresses[0]
        return answers(address, self.config.timeout_s, self.connections.tls_for(address))

    # ---- connections and routing -----------------------------------------------------------

    def connection(self, address: RedisAddress, lane: int) -> Connection:
        """This thread's connection to ``address`` on ``lane``, opened when needed."""
        return self.connections.get(address, lane)

    def _address(self, name: bytes) -> RedisAddress:
        if not self.config.cluster:
            return self.addresses[0]
        slot = key_slot(name)
        node = self.slots.node(slot)
        if node is None:
            self.refresh_slots()
            node = self.slots.node(slot)
            if node is None:
                raise ConnectionError(f"no Redis Cluster node serves slot {slot}")
        return node

    def refresh_slots(self, moved: Sequence[MovedError] = ()) -> None:
        """The slot map from the first seed that answers ``CLUSTER SLOTS``, and ``moved``'s."""
        error: BaseException | None = None
        for seed in self.addresses:
            try:
                reply = self.connection(seed, COMMANDS).call(b"CLUSTER", b"SLOTS")
            except (OSError, RespError) as failure:
                error = failure
                continue
            self.slots.update(reply, seed, moved)
            return
        raise ConnectionError(f"no Redis Cluster seed answered CLUSTER SLOTS: {error}")

    def close(self) -> None:
        """Close every thread's connections (a later call opens new ones)."""
        self.connections.close()
