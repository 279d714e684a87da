"""One connection to a Switchboard server over TCP or TLS, speaking wire-v1 binary frames with asyncio."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl as _ssl
import struct
from collections.abc import Awaitable
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, Union

from . import __version__
from .errors import ConnectionClosedError, FormatError, PlatformException, ServerError, SessionLostError
from .session import CLOSING_ERRORS, FailedRequest, Outgoing, SessionEvent, SessionStreams
from .wire import HEADER_SIZE, NULL_PAYLOAD, Frame, FrameType, encode_frame, parse_header

__all__ = ["Client", "connect"]

_log = logging.getLogger("switchboard")

#: Largest frame the client reads: the most a server can be configured to send.
MAX_INCOMING_FRAME = 1 << 30
_MAX_ID = 0xFFFFFFFF
_LATE_HELLO_WINDOW = 10.0  # seconds a connection given up with its resuming HELLO unanswered may explain a `session_taken`
#: A handler of requests on a REGISTERed channel: the request's payload in, the REPLY's payload out.
RequestHandler = Callable[[Optional[bytes]], Awaitable[Optional[bytes]]]
#: Told each :class:`SessionEvent` of a resumable client as it happens.
SessionEventCallback = Callable[[SessionEvent], None]
#: Frame types of the client's that ask for an answer, so have an entry in ``_pending``.
_REQUESTS = frozenset({FrameType.MESSAGE, FrameType.PING, FrameType.REGISTER, FrameType.UNREGISTER})


async def connect(host: str = "127.0.0.1", port: int = 7420, *, token: Optional[str] = None,
                  ssl: Union[_ssl.SSLContext, bool, None] = None, server_hostname: Optional[str] = None,
                  client_name: Optional[str] = None, timeout: Optional[float] = 10.0, resumable: bool = False,
                  session_bytes: int = 1 << 20, on_session_event: Optional[SessionEventCallback] = None) -> "Client":
    """Connects, sends HELLO (with `token` when given) and returns the client once WELCOME came.

    `ssl` is an :class:`ssl.SSLContext` (or True for the system's default context) to speak TLS, as to the
    server's ``--tls-port``. A wrong token raises :class:`UnauthorizedError`; no server, ``OSError``.

    `resumable` asks for a resumable session (protocol/resumption.md): when the connection drops, the client
    connects again and resumes, so that streams, calls in flight and registered handlers go on as if nothing
    happened; :attr:`Client.session` is None if the server granted none. The client keeps what it sent until
    the server acknowledges it; past `session_bytes` kept, sending waits. :meth:`Client.session_events` (and
    `on_session_event`, called as each happens) tell what became of the session after each drop.
    `timeout` also bounds each try to connect again.
    """
    if session_bytes < 1:
        raise ValueError("session_bytes must be at least 1")
    client = Client()
    client._resumable, client._session_bytes, client._on_session_event = resumable, session_bytes, on_session_event
    await asyncio.wait_for(client._open(host, port, token, ssl, server_hostname, client_name, timeout), timeout)
    return client


class _Pending:
    """A request waiting for its one answer. `on_answer` runs as the answer is read, before anyone awaits it."""

    __slots__ = ("future", "on_answer", "channel")

    def __init__(self, future: asyncio.Future, on_answer: Optional[Callable[[Frame], None]], channel: str) -> None:
        self.future = future
        self.on_answer = on_answer
        self.channel = channel


class Client:
    """A connection to a Switchboard server. Make one with :func:`connect`; use it as ``async with``.

    Every request gets exactly one answer: its REPLY, or an ERROR with its id (raised as
    :class:`ServerError` or one of its subclasses), or :class:`ConnectionClosedError` if the connection
    ends first. A request whose task is cancelled sends CANCEL, and its id stays in use until the
    server's answer to it has come. A resumable client (``connect(resumable=True)``) keeps every request
    through a resumed session; one written on a session that could not be resumed raises
    :class:`SessionLostError`.
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
        # Resumable sessions (protocol/resumption.md)
        self._resumable = False
        self._session_bytes = 1 << 20
        self._on_session_event: Optional[SessionEventCallback] = None
        self._session: Optional[SessionStreams] = None
        self._recovery: Optional[asyncio.Task] = None  # connecting again after a drop
        # When each connection given up with a resuming HELLO unanswered stops explaining a `session_taken` (loop
        # time): such a HELLO may still reach the server and take the session from a later connection, whose
        # `session_taken` is then this client's own doing, but not for ever (protocol/resumption.md).
        self._unanswered_resumes: List[float] = []
        self._ack_timer: Optional[asyncio.TimerHandle] = None
        self._room: List[asyncio.Future] = []  # senders waiting for the kept bytes to fall within the bound
        self._held: Dict[str, Optional[bytes]] = {}  # channel → its REGISTER payload, once the server granted it
        self._credit: Dict[str, int] = {}  # channel → outstanding credit of a paced stream
        self._deferred_listens: Dict[str, Any] = {}  # channel → a stream to listen again once credit is granted
        self._epoch = 0  # goes up when a session is lost: answers to requests forwarded before are not sent
        self._events: List[SessionEvent] = []
        self._events_changed: Optional[asyncio.Future] = None
        self._dial_to: Tuple[str, int, Any, Optional[str]] = ("", 0, None, None)
        self._hello: Dict[str, Any] = {}
        self._timeout: Optional[float] = None

    async def _open(self, host: str, port: int, token: Optional[str], ssl: Any, server_hostname: Optional[str],
                    client_name: Optional[str], timeout: Optional[float]) -> None:
        self._loop = asyncio.get_running_loop()
        if ssl is True:
            ssl = _ssl.create_default_context()
        self._dial_to = (host, port, ssl, server_hostname)
        self._timeout = timeout
        self._hello = {"version": 1, "client": client_name or f"switchboard-python/{__version__}"}
        if token is not None:
            self._hello["token"] = token
        reader, writer = await self._dial()
        try:
            self.welcome = await self._handshake(reader, writer, {} if self._resumable else None)
        except BaseException:
            writer.close()
            raise
        self._start_session(self.welcome)
        self._install(reader, writer)

    async def _dial(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port, ssl, server_hostname = self._dial_to
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl or None, server_hostname=(server_hostname or host) if ssl else None,
            limit=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small frame per request
        return reader, writer

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         session: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """Sends HELLO (with `session` when given) and returns its WELCOME's payload; an ERROR answer raises its
        :class:`ServerError`, a connection that ends first :class:`ConnectionClosedError`."""
        hello = dict(self._hello)
        if session is not None:
            hello["session"] = session
        writer.write(encode_frame(Frame(FrameType.HELLO, 1, "", json.dumps(hello).encode())))
        try:
            await writer.drain()
            while True:
                frame, _ = await _read_frame(reader)
                if frame.type == FrameType.WELCOME:
                    welcome = json.loads(frame.payload or b"{}")
                    if not isinstance(welcome, dict):
                        raise FormatError("WELCOME is not a JSON object")
                    return welcome
                if frame.type == FrameType.ERROR:
                    raise _server_error(frame.payload)
                if frame.type != FrameType.GOAWAY:
                    raise FormatError(f"frame type {frame.type} before WELCOME")
                self._note_goaway(frame)
        except asyncio.IncompleteReadError:
            raise ConnectionClosedError("the server closed the connection") from None
        except (FormatError, UnicodeDecodeError, ValueError) as error:
            raise ConnectionClosedError(f"the server sent a frame this client cannot read: {error}") from None

    def _install(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Makes a connection whose handshake is done the client's, and starts reading it."""
        self._reader, self._writer = reader, writer
        self._read_task = self._loop.create_task(self._read_frames(reader, writer))
        self._pump()

    def _start_session(self, welcome: Dict[str, Any]) -> None:
        """Begins the session a WELCOME granted (or none)."""
        granted = welcome.get("session")
        valid = isinstance(granted, dict) and isinstance(granted.get("token"), str) and 0 < len(granted["token"]) <= 256
        self._session = SessionStreams(granted, self._session_bytes) if self._resumable and valid else None
        self._wake_room()

    # MARK: Public API

    @property
    def is_open(self) -> bool:
        """True until the connection has ended (closed by either side; for a resumable client, for good)."""
        return self._ended is None

    @property
    def session(self) -> Optional[Dict[str, Any]]:
        """The resumable session's part of the WELCOME that granted it (``token``, ``ttlMs``, ``ackBytes``,
        ``ackMs``, …), or None without one (not asked for, not granted, or ended)."""
        if self._session is None:
            return None
        granted = self.welcome.get("session")
        return dict(granted) if isinstance(granted, dict) else None

    @property
    def session_reports(self) -> List[SessionEvent]:
        """Every :class:`SessionEvent` so far, oldest first."""
        return list(self._events)

    async def session_events(self) -> AsyncIterator[SessionEvent]:
        """Every :class:`SessionEvent` from the first on, as it happens; the iteration ends when the client closes.
        Each call iterates on its own, from the first event."""
        index = 0
        while True:
            while index < len(self._events):
                index += 1
                yield self._events[index - 1]
            if self._ended is not None:
                return
            if self._events_changed is None or self._events_changed.done():
                self._events_changed = self._loop.create_future()
            await asyncio.shield(self._events_changed)

    async def close(self) -> None:
        """Closes the connection (ending a resumable session first, with END). Requests still waiting fail with
        :class:`ConnectionClosedError`."""
        if self._recovery is not None and self._recovery is not asyncio.current_task():
            self._recovery.cancel()
        if self._writer is not None and not self._writer.is_closing():
            if self._session is not None:
                self._writer.write(encode_frame(Frame(FrameType.END)))
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
        if credit == 0xFFFFFFFF:
            self._credit.pop(channel, None)
        else:
            self._credit[channel] = min(self._credit.get(channel, 0) + credit, 0xFFFFFFFE)
        deferred = self._deferred_listens.pop(channel, None)
        if deferred is not None:
            self._listen_again(channel, deferred)
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
        self._held[channel] = payload

    async def unregister(self, channel: str) -> None:
        """Gives a REGISTERed channel back (UNREGISTER)."""
        try:
            await self.request(FrameType.UNREGISTER, channel, None)
        finally:
            self._handlers.pop(channel, None)
            self._held.pop(channel, None)

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
        self._pending[frame_id] = _Pending(future, on_answer, channel)
        self._emit(Outgoing(data, frame_type, frame_id, channel))
        return frame_id, future

    def _write(self, frame: Frame) -> None:
        self._emit(Outgoing(encode_frame(frame), frame.type, frame.id, frame.channel))

    def _emit(self, frame: Outgoing) -> None:
        """Writes a frame; with a session, into its stream, which keeps it until acknowledged and holds it back while
        there is no connection or no room."""
        if self._session is not None:
            self._session.append(frame)
            self._pump()
        elif self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame.data)

    def _pump(self) -> None:
        """Writes what the session's stream holds back, as far as the connection and the bound allow."""
        writer = self._writer
        if self._session is None or writer is None or writer.is_closing():
            return
        for data in self._session.writable():
            writer.write(data)

    async def _drain(self) -> None:
        if self._session is not None or self._recovery is not None:
            # A resumable client: a lost connection is resumed, not raised; past the bound, wait for room.
            while self._session is not None and self._session.over_bound and self._ended is None:
                waiter = self._loop.create_future()
                self._room.append(waiter)
                await waiter
            self._check_open()
            if self._writer is not None:
                try:
                    await self._writer.drain()
                except (ConnectionError, _ssl.SSLError):
                    pass  # the reader notices the loss and connects again
            return
        try:
            await self._writer.drain()
        except (ConnectionError, _ssl.SSLError) as error:
            self._connection_ended(ConnectionClosedError(f"the connection was lost: {error}"))
            self._check_open()

    # MARK: Reading

    async def _read_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ended = ConnectionClosedError("the server closed the connection")
        try:
            while True:
                frame, size = await _read_frame(reader)
                session = self._session
                if session is not None and frame.type in (FrameType.POSITION, FrameType.END):
                    self._session_frame(session, frame)
                    continue
                self._dispatch(frame)
                if session is not None and self._session is session and not _closes(frame):
                    self._received(session, size)
        except asyncio.IncompleteReadError:
            pass
        except asyncio.CancelledError:
            return
        except (OSError, _ssl.SSLError) as error:
            ended = ConnectionClosedError(f"the connection was lost: {error}")
        except (FormatError, UnicodeDecodeError) as error:
            ended = ConnectionClosedError(f"the server sent a frame this client cannot read: {error}")
        writer.close()
        if writer is not self._writer or self._ended is not None:
            return  # a connection the client has already let go of
        if self._session is None:
            self._connection_ended(ended)
            return
        taken = self._closing_error is not None and self._closing_error.code == "session_taken"
        if taken:
            now = self._loop.time()
            self._unanswered_resumes = [until for until in self._unanswered_resumes if until > now]
            if self._unanswered_resumes:  # most likely an earlier connection of this client's, read late: resume again
                self._unanswered_resumes.pop(0)
                taken = False
        self._closing_error = None
        self._reader = self._writer = None
        self._recovery = self._loop.create_task(self._recover(self._session, taken))

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
                    if frame.payload is None:
                        self._credit.pop(frame.channel, None)  # credit ends with its stream
                    elif frame.channel in self._credit:
                        self._credit[frame.channel] = max(0, self._credit[frame.channel] - 1)
            else:
                self._serve(frame)
        elif kind == FrameType.PING:
            self._write(Frame(FrameType.PONG, frame.id, "", frame.payload))
        elif kind == FrameType.GOAWAY:
            self._note_goaway(frame)
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

        epoch = self._epoch

        async def answer() -> None:
            payload = None  # a handler that fails still answers: with a null reply
            try:
                payload = await handler(frame.payload)
            except Exception:
                _log.exception("the handler of %s failed; answering with a null reply", frame.channel)
            finally:
                if epoch == self._epoch:  # not a request of a session that was lost
                    self._serving.pop(frame.id, None)
                    self._write(Frame(FrameType.REPLY, frame.id, "", payload))

        self._serving[frame.id] = self._loop.create_task(answer())

    def _connection_ended(self, ended: ConnectionClosedError) -> None:
        """Fails everything still waiting, once; streams end with the error after the events they already got."""
        if self._ended is not None:
            return
        if self._recovery is not None and self._recovery is not asyncio.current_task():
            self._recovery.cancel()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
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
        self._wake_room()
        self._events_updated()

    def _note_goaway(self, frame: Frame) -> None:
        try:
            self.goaway = str(json.loads(frame.payload or b"{}").get("reason", ""))
        except (ValueError, AttributeError):
            self.goaway = ""

    # MARK: Resumable sessions (protocol/resumption.md)

    def _received(self, session: SessionStreams, size: int) -> None:
        """Counts a frame of the server's stream as handled, and acknowledges per the WELCOME's ackBytes and ackMs."""
        session.received += size
        if session.received - session.told >= session.ack_bytes:
            self._send_position()
        elif self._ack_timer is None:
            self._ack_timer = self._loop.call_later(session.ack_ms / 1000, self._send_position)

    def _send_position(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        session, writer = self._session, self._writer
        if session is None or writer is None or writer.is_closing() or session.received == session.told:
            return  # with no connection, the resuming HELLO tells the position
        writer.write(encode_frame(Frame(FrameType.POSITION, 0, "", struct.pack(">Q", session.received))))
        session.told = session.received

    def _session_frame(self, session: SessionStreams, frame: Frame) -> None:
        """POSITION (the server's received position) or END (the server ended the session) on a session's connection."""
        if frame.type == FrameType.POSITION:
            position = struct.unpack(">Q", frame.payload)[0] if frame.payload and len(frame.payload) == 8 else -1
            if not session.acknowledge(position):
                _log.warning("the server acknowledged position %d, outside %d…%d; ignored",
                             position, session.acked, session.written)
            self._pump()
            self._wake_room()
            return
        try:
            reason = str(json.loads(frame.payload or b"{}").get("reason", "ended"))
        except (ValueError, AttributeError):
            reason = "ended"
        # The connection goes on as a plain one: what the stream held back is written as is.
        self._session = None
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self._writer is not None:
            for held in session.take_unwritten():
                self._writer.write(held.data)
        self._wake_room()
        streams = tuple(channel for channel, state in self._streams.items() if not state.ended)
        self._report(SessionEvent("ended", reason, streams=streams))

    async def _recover(self, session: SessionStreams, taken: bool) -> None:
        """After a drop: resumes the session, trying for its time to live and once more, else falls back."""
        try:
            reason, link = "taken", None
            if not taken:
                deadline = self._loop.time() + session.ttl_ms / 1000
                delay = 0.01
                while True:
                    final = self._loop.time() >= deadline
                    outcome = await self._try_resume(session)
                    if outcome is True:
                        return
                    if outcome is not None:
                        reason, link = outcome
                        break
                    if final:
                        reason = "expired"
                        break
                    await asyncio.sleep(min(delay, max(0.0, deadline - self._loop.time())))
                    delay = min(delay * 2, 1.0)
            await self._fall_back(session, reason, link)
        except ServerError as error:  # such as `unauthorized`: the client cannot go on
            self._connection_ended(ConnectionClosedError("the server refused the connection", error))
        finally:
            if self._recovery is asyncio.current_task():
                self._recovery = None

    async def _try_resume(self, session: SessionStreams) -> Any:
        """One try: True when resumed; ``(reason, link or None)`` when the session cannot be resumed; None when no
        answer came (no connection, or it dropped)."""
        try:
            reader, writer = await asyncio.wait_for(self._dial(), self._timeout)
        except (OSError, asyncio.TimeoutError, _ssl.SSLError):
            return None
        position = session.received
        try:
            welcome = await asyncio.wait_for(
                self._handshake(reader, writer, {"token": session.token, "position": position}), self._timeout)
        except ServerError as error:
            if error.code != "cannot_resume":
                writer.close()
                raise
            details = error.details if isinstance(error.details, dict) else {}
            return str(details.get("reason", "unknown")), (reader, writer)
        except (OSError, ConnectionClosedError, asyncio.TimeoutError, _ssl.SSLError):
            writer.close()
            self._unanswered_resumes.append(self._loop.time() + _LATE_HELLO_WINDOW)
            return None
        granted = welcome.get("session")
        if not isinstance(granted, dict):
            self.welcome = welcome  # a plain connection: the client goes on without a session
            return "unsupported", (reader, writer)
        server_position = granted.get("position")
        if granted.get("resumed") is not True or not isinstance(server_position, int) or not session.rewind(server_position):
            writer.close()
            return "position", None
        session.told = position
        self._install(reader, writer)
        self._wake_room()  # the WELCOME's position acknowledges like a POSITION
        self._report(SessionEvent("resumed"))
        return True

    async def _fall_back(self, old: SessionStreams, reason: str, link: Any) -> None:
        """What the client does when a session cannot be resumed (protocol/resumption.md): fails the requests
        written on it, forgets those forwarded to it, makes a new session, registers and listens again, and
        sends the frames that were never written; then reports ``restarted``."""
        welcome = self.welcome
        self._unanswered_resumes = []  # a late HELLO names the old session's token
        if reason != "unsupported":
            deadline = self._loop.time() + old.ttl_ms / 1000
            welcome, link = await self._new_session(link, deadline)
        # From here on nothing awaits until the new session's frames are in order: what the application sends
        # meanwhile goes to the old session's stream until it is taken out here, then to the new one.
        kept = old.take_unwritten()
        unwritten = {frame.id for frame in kept if frame.type in _REQUESTS and frame.id}
        failed = []
        for frame_id in [frame_id for frame_id in self._pending if frame_id not in unwritten]:
            entry = self._pending.pop(frame_id)
            failed.append(FailedRequest(frame_id, entry.channel))
            if not entry.future.done():
                entry.future.set_exception(SessionLostError(reason))
                entry.future.add_done_callback(_ignore_outcome)
        self._epoch += 1
        serving, self._serving = self._serving, {}
        for task in serving.values():
            task.cancel()
        streams = [(channel, state) for channel, state in self._streams.items()
                   if not state.ended and not state.cancelling and getattr(state, "listen_payload", None) is not None]
        listened = {channel for channel, _ in streams}
        kept = [frame for frame in kept if _still_wanted(frame, self._pending, listened)]
        if link is None:
            self._report(SessionEvent("ended", reason, streams=tuple(listened), channels=tuple(self._held),
                                      failed=tuple(failed)))
            self._connection_ended(ConnectionClosedError(f"the session was lost ({reason}) and the server could "
                                                         "not be reached again"))
            return
        self.welcome = welcome
        self._start_session(welcome)
        self._install(*link)
        answers = [self._register_again(channel, declaration) for channel, declaration in self._held.items()]
        for channel, state in streams:
            credit = self._credit.get(channel)
            if credit == 0:
                self._deferred_listens[channel] = state  # listened again once the application grants credit
                continue
            if credit is not None:
                self._write(Frame(FrameType.DEMAND, 0, channel, struct.pack(">I", credit)))
            answers.append(self._listen_again(channel, state))
        for frame in kept:
            self._emit(frame)
        channels = tuple(self._held)
        await asyncio.gather(*answers, return_exceptions=True)
        self._report(SessionEvent("restarted", reason, streams=tuple(listened), channels=channels, failed=tuple(failed)))

    async def _new_session(self, link: Any, deadline: float) -> Tuple[Dict[str, Any], Any]:
        """A HELLO asking for a new session, on `link` or on new connections until `deadline` (and once more):
        the WELCOME and the connection, or ``({}, None)``."""
        delay = 0.01
        while True:
            final = self._loop.time() >= deadline
            if link is None:
                try:
                    link = await asyncio.wait_for(self._dial(), self._timeout)
                except (OSError, asyncio.TimeoutError, _ssl.SSLError):
                    link = None
            if link is not None:
                try:
                    return await asyncio.wait_for(self._handshake(*link, {}), self._timeout), link
                except (OSError, ConnectionClosedError, asyncio.TimeoutError, _ssl.SSLError):
                    link[1].close()
                    link = None
            if final:
                return {}, None
            await asyncio.sleep(min(delay, max(0.0, deadline - self._loop.time())))
            delay = min(delay * 2, 1.0)

    def _register_again(self, channel: str, declaration: Optional[bytes]) -> asyncio.Future:
        _, future = self._send_request(FrameType.REGISTER, channel, declaration)

        def registered(done: asyncio.Future) -> None:
            if done.cancelled() or done.exception() is None:
                return
            _log.warning("channel %s could not be registered again after the session was lost: %s",
                         channel, done.exception())
            self._handlers.pop(channel, None)
            self._held.pop(channel, None)
        future.add_done_callback(registered)
        return future

    def _listen_again(self, channel: str, state: Any) -> asyncio.Future:
        """Sends the stream's `listen` again; a refusal ends the stream with the error."""
        def on_answer(frame: Frame) -> None:
            try:
                if frame.payload is None:
                    raise PlatformException("not_implemented", f"listen on {channel} is not implemented any more")
                state.codec.decode_envelope(frame.payload)
            except (PlatformException, FormatError) as error:
                state.finish(error)

        _, future = self._send_request(FrameType.MESSAGE, channel, state.listen_payload, on_answer)

        def answered(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is not None:
                state.finish(done.exception())
        future.add_done_callback(answered)
        return future

    def _report(self, event: SessionEvent) -> None:
        self._events.append(event)
        self._events_updated()
        if self._on_session_event is not None:
            try:
                self._on_session_event(event)
            except Exception:
                _log.exception("the on_session_event callback failed")

    def _events_updated(self) -> None:
        if self._events_changed is not None and not self._events_changed.done():
            self._events_changed.set_result(None)

    def _wake_room(self) -> None:
        room, self._room = self._room, []
        for waiter in room:
            if not waiter.done():
                waiter.set_result(None)


async def _read_frame(reader: asyncio.StreamReader) -> Tuple[Frame, int]:
    """The next frame, and its size on the wire (the length field included)."""
    header = await reader.readexactly(HEADER_SIZE)
    length, frame_type, flags, chanlen, frame_id = parse_header(header)
    if length > MAX_INCOMING_FRAME:
        raise FormatError(f"a frame of {length} bytes is over {MAX_INCOMING_FRAME}")
    body = await reader.readexactly(length - 8)
    channel = body[:chanlen].decode("utf-8")
    payload = None if flags & NULL_PAYLOAD else body[chanlen:]
    return Frame(frame_type, frame_id, channel, payload), length + 4


def _closes(frame: Frame) -> bool:
    """True for an ERROR after which the server closes the connection: it is not in the server's stream."""
    return frame.type == FrameType.ERROR and _server_error(frame.payload).code in CLOSING_ERRORS


def _still_wanted(frame: Outgoing, pending: Dict[int, Any], listened: set) -> bool:
    """Whether a frame never written on a lost session goes on the new one: requests still waiting (and their
    CANCELs), sends, and credit for streams not listened to again; not answers to forwarded requests or PINGs."""
    if frame.type in _REQUESTS or frame.type == FrameType.CANCEL:
        return frame.id == 0 or frame.id in pending
    if frame.type == FrameType.DEMAND:
        return frame.channel not in listened
    return frame.type not in (FrameType.REPLY, FrameType.PONG)


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
