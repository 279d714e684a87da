"""One connection to a Switchboard server over TCP or TLS, speaking wire-v1 binary frames with asyncio."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl as _ssl
import struct
from collections.abc import Awaitable
from typing import Any, Callable, Dict, Optional, Tuple, Union

from . import __version__
from .errors import ConnectionClosedError, FormatError, ServerError
from .wire import HEADER_SIZE, NULL_PAYLOAD, Frame, FrameType, encode_frame, parse_header

__all__ = ["Client", "connect"]

_log = logging.getLogger("switchboard")

#: Largest frame the client reads: the most a server can be configured to send.
MAX_INCOMING_FRAME = 1 << 30
_MAX_ID = 0xFFFFFFFF
#: A handler of requests on a REGISTERed channel: the request's payload in, the REPLY's payload out.
RequestHandler = Callable[[Optional[bytes]], Awaitable[Optional[bytes]]]


async def connect(host: str = "127.0.0.1", port: int = 7420, *, token: Optional[str] = None,
                  ssl: Union[_ssl.SSLContext, bool, None] = None, server_hostname: Optional[str] = None,
                  client_name: Optional[str] = None, timeout: Optional[float] = 10.0) -> "Client":
    """Connects, sends HELLO (with `token` when given) and returns the client once WELCOME came.

    `ssl` is an :class:`ssl.SSLContext` (or True for the system's default context) to speak TLS, as to the
    server's ``--tls-port``. A wrong token raises :class:`UnauthorizedError`; no server, ``OSError``.
    """
    client = Client()
    await asyncio.wait_for(client._open(host, port, token, ssl, server_hostname, client_name), timeout)
    return client


class _Pending:
    """A request waiting for its one answer. `on_answer` runs as the answer is read, before anyone awaits it."""

    __slots__ = ("future", "on_answer")

    def __init__(self, future: asyncio.Future, on_answer: Optional[Callable[[Frame], None]]) -> None:
        self.future = future
        self.on_answer = on_answer


class Client:
    """A connection to a Switchboard server. Make one with :func:`connect`; use it as ``async with``.

    Every request gets exactly one answer: its REPLY, or an ERROR with its id (raised as
    :class:`ServerError` or one of its subclasses), or :class:`ConnectionClosedError` if the connection
    ends first. A request whose task is cancelled sends CANCEL, and its id stays in use until the
    server's answer to it has come.
    """

    def __init__(self) -> None:
        self.welcome: Dict[str, Any] = {}
        """The WELCOME payload: ``{"version", "server", "maxFrame", "heartbeatMs"}``."""
        self.goaway: Optional[str] = None
        """The reason of the server's GOAWAY, once it has sent one (it is shutting down)."""
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._pending: Dict[int, _Pending] = {}
        self._last_id = 0
        self._streams: Dict[str, Any] = {}  # channel → the _StreamState of the active stream
        self._handlers: Dict[str, RequestHandler] = {}  # channel → handler of a REGISTERed channel
        self._serving: Dict[int, asyncio.Task] = {}  # id of a forwarded request → its handler's task
        self._closing_error: Optional[ServerError] = None
        self._ended: Optional[ConnectionClosedError] = None
        self._read_task: Optional[asyncio.Task] = None

    async def _open(self, host: str, port: int, token: Optional[str], ssl: Any, server_hostname: Optional[str],
                    client_name: Optional[str]) -> None:
        self._loop = asyncio.get_running_loop()
        if ssl is True:
            ssl = _ssl.create_default_context()
        self._reader, self._writer = await asyncio.open_connection(
            host, port, ssl=ssl or None, server_hostname=(server_hostname or host) if ssl else None,
            limit=1 << 20)
        sock = self._writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small frame per request
        self._read_task = self._loop.create_task(self._read_frames())
        hello: Dict[str, Any] = {"version": 1, "client": client_name or f"switchboard-python/{__version__}"}
        if token is not None:
            hello["token"] = token
        try:
            answer = await self.request(FrameType.HELLO, "", json.dumps(hello).encode())
        except BaseException:
            await self.close()
            raise
        self.welcome = json.loads(answer.payload or b"{}")

    # MARK: Public API

    @property
    def is_open(self) -> bool:
        """True until the connection has ended (closed by either side)."""
        return self._ended is None

    async def close(self) -> None:
        """Closes the connection. Requests still waiting fail with :class:`ConnectionClosedError`."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.close()
        self._connection_ended(ConnectionClosedError("the client was closed"))
        if self._read_task is not None and self._read_task is not asyncio.current_task():
            self._read_task.cancel()
            try:
                await self._read_task
            except BaseException:
                pass
        if self._writer is not None:
            try:
                await self._writer.wait_closed()
            except (OSError, _ssl.SSLError):
                pass

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def request(self, frame_type: int, channel: str, payload: Optional[bytes],
                      on_answer: Optional[Callable[[Frame], None]] = None) -> Frame:
        """Sends a frame that wants an answer (MESSAGE, HELLO, PING, REGISTER, UNREGISTER) and returns the answer.

        An ERROR answer raises its :class:`ServerError`. Cancelling the awaiting task sends CANCEL for a
        MESSAGE; the answer that still comes is then dropped.
        """
        frame_id, future = self._send_request(frame_type, channel, payload, on_answer)
        try:
            await self._drain()
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                future.add_done_callback(_ignore_outcome)
                if frame_type == FrameType.MESSAGE and self.is_open:
                    self._write(Frame(FrameType.CANCEL, frame_id))
            raise

    async def ping(self, payload: Optional[bytes] = None) -> Optional[bytes]:
        """Sends PING and returns the PONG's payload (a round trip: everything sent before has been read)."""
        return (await self.request(FrameType.PING, "", payload)).payload

    async def send(self, channel: str, payload: Optional[bytes]) -> None:
        """Sends a MESSAGE that wants no answer (id 0): an event, when this client holds `channel` as an event
        channel (``payload`` an envelope of the channel's method codec, None for the end of the stream)."""
        self._check_open()
        self._write(Frame(FrameType.MESSAGE, 0, channel, payload))
        await self._drain()

    async def demand(self, channel: str, credit: int) -> None:
        """Grants `credit` more events on `channel`'s stream (DEMAND); 0xFFFFFFFF returns it to push mode."""
        if not 0 < credit <= 0xFFFFFFFF:
            raise ValueError("credit is 1 … 0xFFFFFFFF")
        self._check_open()
        self._write(Frame(FrameType.DEMAND, 0, channel, struct.pack(">I", credit)))
        await self._drain()

    async def register(self, channel: str, handler: RequestHandler, declaration: Optional[Dict[str, str]] = None) -> None:
        """Becomes the handler of `channel` (REGISTER): every request another client sends to it comes to
        `handler`. `declaration` (``{"kind": …, "codec": …}``) lets text-mode clients use it.
        Raises :class:`ServerError` ``channel_taken`` when someone else handles it."""
        payload = json.dumps(declaration).encode() if declaration else None
        self._handlers[channel] = handler
        try:
            await self.request(FrameType.REGISTER, channel, payload)
        except BaseException:
            if self._handlers.get(channel) is handler:
                del self._handlers[channel]
            raise

    async def unregister(self, channel: str) -> None:
        """Gives a REGISTERed channel back (UNREGISTER)."""
        try:
            await self.request(FrameType.UNREGISTER, channel, None)
        finally:
            self._handlers.pop(channel, None)

    # MARK: Sending

    def _check_open(self) -> None:
        if self._ended is not None:
            raise ConnectionClosedError("the connection is closed", self._ended.error, self._ended.goaway)

    def _next_id(self) -> int:
        for _ in range(len(self._pending) + 1):
            self._last_id = self._last_id % _MAX_ID + 1
            if self._last_id not in self._pending:
                return self._last_id
        raise RuntimeError("no free request id")  # unreachable: fewer than 2^32 requests can be pending

    def _send_request(self, frame_type: int, channel: str, payload: Optional[bytes],
                      on_answer: Optional[Callable[[Frame], None]] = None) -> Tuple[int, asyncio.Future]:
        """Writes the request at once (so requests go out in call order); returns its id and its answer's future.
        A frame larger than the server's maxFrame raises FormatError (the server would close the connection)."""
        self._check_open()
        frame_id = self._next_id()
        data = encode_frame(Frame(frame_type, frame_id, channel, payload))
        max_frame = self.welcome.get("maxFrame")
        if isinstance(max_frame, int) and len(data) - 4 > max_frame:
            raise FormatError(f"a frame of {len(data) - 4} bytes exceeds the server's maxFrame of {max_frame}")
        future = self._loop.create_future()
        self._pending[frame_id] = _Pending(future, on_answer)
        self._writer.write(data)
        return frame_id, future

    def _write(self, frame: Frame) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode_frame(frame))

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, _ssl.SSLError) as error:
            self._connection_ended(ConnectionClosedError(f"the connection was lost: {error}"))
            self._check_open()

    # MARK: Reading

    async def _read_frames(self) -> None:
        ended = ConnectionClosedError("the server closed the connection")
        try:
            while True:
                header = await self._reader.readexactly(HEADER_SIZE)
                length, frame_type, flags, chanlen, frame_id = parse_header(header)
                if length > MAX_INCOMING_FRAME:
                    raise FormatError(f"a frame of {length} bytes is over {MAX_INCOMING_FRAME}")
                body = await self._reader.readexactly(length - 8)
                channel = body[:chanlen].decode("utf-8")
                payload = None if flags & NULL_PAYLOAD else body[chanlen:]
                self._dispatch(Frame(frame_type, frame_id, channel, payload))
        except asyncio.IncompleteReadError:
            pass
        except asyncio.CancelledError:
            return
        except (OSError, _ssl.SSLError) as error:
            ended = ConnectionClosedError(f"the connection was lost: {error}")
        except (FormatError, UnicodeDecodeError) as error:
            ended = ConnectionClosedError(f"the server sent a frame this client cannot read: {error}")
        if self._writer is not None:
            self._writer.close()
        self._connection_ended(ended)

    def _dispatch(self, frame: Frame) -> None:
        kind = frame.type
        if kind in (FrameType.REPLY, FrameType.PONG, FrameType.WELCOME):
            self._answer(frame, None)
        elif kind == FrameType.ERROR:
            error = _server_error(frame.payload)
            if not (frame.id and self._answer(frame, error)):
                self._closing_error = error  # about no request of ours: it may be why the server closes
        elif kind == FrameType.MESSAGE:
            if frame.id == 0:
                stream = self._streams.get(frame.channel)
                if stream is not None:
                    stream.deliver(frame.payload)
            else:
                self._serve(frame)
        elif kind == FrameType.PING:
            self._write(Frame(FrameType.PONG, frame.id, "", frame.payload))
        elif kind == FrameType.GOAWAY:
            try:
                self.goaway = str(json.loads(frame.payload or b"{}").get("reason", ""))
            except (ValueError, AttributeError):
                self.goaway = ""
        elif kind == FrameType.CANCEL:
            task = self._serving.get(frame.id)
            if task is not None:
                task.cancel()

    def _answer(self, frame: Frame, error: Optional[ServerError]) -> bool:
        pending = self._pending.pop(frame.id, None)
        if pending is None:
            return False
        if pending.on_answer is not None and error is None:
            pending.on_answer(frame)
        if not pending.future.done():
            if error is None:
                pending.future.set_result(frame)
            else:
                pending.future.set_exception(error)
        return True

    def _serve(self, frame: Frame) -> None:
        """Runs the handler of a REGISTERed channel for a forwarded request; its REPLY is the one answer."""
        handler = self._handlers.get(frame.channel)
        if handler is None:
            self._write(Frame(FrameType.REPLY, frame.id))
            return

        async def answer() -> None:
            payload = None  # a handler that fails still answers: with a null reply
            try:
                payload = await handler(frame.payload)
            except Exception:
                _log.exception("the handler of %s failed; answering with a null reply", frame.channel)
            finally:
                self._serving.pop(frame.id, None)
                self._write(Frame(FrameType.REPLY, frame.id, "", payload))

        self._serving[frame.id] = self._loop.create_task(answer())

    def _connection_ended(self, ended: ConnectionClosedError) -> None:
        """Fails everything still waiting, once; streams end with the error after the events they already got."""
        if self._ended is not None:
            return
        if ended.error is None and self._closing_error is not None:
            ended = ConnectionClosedError(str(ended), self._closing_error, self.goaway)
        ended.goaway = self.goaway
        self._ended = ended
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(ConnectionClosedError(str(ended.args[0]), ended.error, ended.goaway))
                entry.future.add_done_callback(_ignore_outcome)
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.connection_ended(ended)
        for task in list(self._serving.values()):
            task.cancel()


def _server_error(payload: Optional[bytes]) -> ServerError:
    """The exception of an ERROR frame's JSON ``{"code", "message", "details"}``."""
    try:
        body = json.loads(payload or b"{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return ServerError.of(str(body.get("code", "error")), body.get("message"), body.get("details"))


def _ignore_outcome(future: asyncio.Future) -> None:
    """Marks an answer nobody awaits as seen, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
