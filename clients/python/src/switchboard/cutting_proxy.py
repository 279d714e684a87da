"""A TCP proxy for tests of resumable sessions: it forwards connections to a server and cuts them (a reset to
both sides, as a phone in a tunnel loses its connection) at random byte offsets, or when told."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Dict, Optional, Set, Tuple

__all__ = ["CuttingProxy"]


class _Pair:
    """One proxied connection: its two sides and how many bytes it has forwarded, both ways together."""

    __slots__ = ("client", "server", "limit", "forwarded", "cut")

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter, limit: Optional[int]) -> None:
        self.client = client
        self.server = server
        self.limit = limit
        self.forwarded = 0
        self.cut = False


class CuttingProxy:
    """Listens on ``host:port`` (a free port) and forwards each connection to ``target_host:target_port``.

    With `cut_after` ``(low, high)``, each connection is cut once it has forwarded a number of bytes (both ways
    together) drawn from ``random.Random(seed)`` between `low` and `high`: the bytes up to that offset are
    delivered, then both sides are reset. :meth:`cut` cuts every connection now; :meth:`hold` makes new
    connections wait (accepted, nothing forwarded) until :meth:`release`, which lets all of them go or one;
    :meth:`refuse` closes new ones at once.
    Use it as ``async with CuttingProxy(...) as proxy``.
    """

    def __init__(self, target_host: str, target_port: int, *, seed: Optional[int] = None,
                 cut_after: Optional[Tuple[int, int]] = None, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.seed = seed if seed is not None else random.randrange(1 << 32)
        self.cut_after = cut_after
        self.host = host
        self.port = 0
        self.cuts = 0
        """How many connections the proxy has cut."""
        self.connections = 0
        """How many connections the proxy has forwarded."""
        self.accepted = 0
        """How many connections the proxy has accepted (held ones too)."""
        self._accepting = asyncio.Condition()
        self._random = random.Random(self.seed)
        self._holding = False
        self._held: Dict[int, asyncio.Event] = {}
        self._refusing = False
        self._pairs: Set[_Pair] = set()
        self._tasks: Set[asyncio.Task] = set()
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> "CuttingProxy":
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stops listening and closes every connection."""
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            self._cut(pair, counted=False)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> "CuttingProxy":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def cut(self) -> int:
        """Cuts every connection now; returns how many it cut."""
        pairs = [pair for pair in self._pairs if not pair.cut]
        for pair in pairs:
            self._cut(pair)
        return len(pairs)

    async def wait_accepted(self, count: int) -> None:
        """Returns once the proxy has accepted `count` connections in all."""
        async with self._accepting:
            await self._accepting.wait_for(lambda: self.accepted >= count)

    def hold(self, holding: bool = True) -> None:
        """New connections are accepted but wait, forwarding nothing (what their client sends waits in the
        proxy), until :meth:`release`; ``hold(False)`` lets new ones through again and keeps those held."""
        self._holding = holding

    def release(self, connection: Optional[int] = None) -> None:
        """Lets the held connection numbered `connection` go (in order of acceptance, from 1; a client that has
        given it up meanwhile still has what it sent delivered, as a packet late out of a tunnel), or, without
        it, every held connection, and holds no more."""
        if connection is None:
            self._holding = False
            held, self._held = self._held, {}
            for gate in held.values():
                gate.set()
        elif connection in self._held:
            self._held.pop(connection).set()

    def refuse(self, refusing: bool = True) -> None:
        """New connections are closed at once (a server out of reach), until ``refuse(False)``."""
        self._refusing = refusing

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            self.accepted += 1
            number = self.accepted
            async with self._accepting:
                self._accepting.notify_all()
            if self._holding:
                gate = self._held[number] = asyncio.Event()
                await gate.wait()
            if self._refusing:
                client_writer.transport.abort()
                return
            try:
                server_reader, server_writer = await asyncio.open_connection(*self.target)
            except OSError:
                client_writer.transport.abort()
                return
            limit = self._random.randint(*self.cut_after) if self.cut_after else None
            pair = _Pair(client_writer, server_writer, limit)
            self.connections += 1
            self._pairs.add(pair)
            try:
                await asyncio.gather(self._pipe(pair, client_reader, server_writer),
                                     self._pipe(pair, server_reader, client_writer))
            finally:
                self._pairs.discard(pair)
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)

    async def _pipe(self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not pair.cut:
                data = await reader.read(65536)
                if not data or pair.cut:
                    break
                if pair.limit is not None and pair.forwarded + len(data) >= pair.limit:
                    writer.write(data[:pair.limit - pair.forwarded])
                    pair.forwarded = pair.limit
                    await writer.drain()
                    self._cut(pair)
                    return
                pair.forwarded += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        if not pair.cut:  # one side closed: close the other
            pair.cut = True
            pair.client.close()
            pair.server.close()

    def _cut(self, pair: _Pair, counted: bool = True) -> None:
        if pair.cut:
            return
        pair.cut = True
        if counted:
            self.cuts += 1
        pair.client.transport.abort()
        pair.server.transport.abort()
