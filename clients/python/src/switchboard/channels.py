"""Flutter's channel classes, over a :class:`~switchboard.client.Client`."""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

from .client import Client, _ignore_outcome
from .codec import (
    BinaryCodec, JSONMessageCodec, JSONMethodCodec, MessageCodec, MethodCall, MethodCodec, StandardMessageCodec,
    StandardMethodCodec, StringCodec,
)
from .errors import ConnectionClosedError, FormatError, MissingPluginException, PlatformException
from .wire import FrameType

__all__ = ["MethodChannel", "EventChannel", "BasicMessageChannel", "EventStream"]

MethodCallHandler = Callable[[MethodCall], Union[Any, Awaitable[Any]]]
MessageHandler = Callable[[Any], Union[Any, Awaitable[Any]]]


def _codec_name(codec: Any) -> Optional[str]:
    """The name REGISTER declares for a codec (wire-v1 section 6), or None for a codec of one's own."""
    for kind, name in ((StandardMethodCodec, "standard"), (StandardMessageCodec, "standard"),
                       (JSONMethodCodec, "json"), (JSONMessageCodec, "json"), (StringCodec, "string"),
                       (BinaryCodec, "binary")):
        if type(codec) is kind:
            return name
    return None


def _declaration(kind: str, codec: Any) -> dict:
    name = _codec_name(codec)
    return {"kind": kind, "codec": name} if name else {"kind": kind}


async def _call(handler: Callable[[Any], Any], argument: Any) -> Any:
    result = handler(argument)
    return await result if inspect.isawaitable(result) else result


class MethodChannel:
    """Flutter's MethodChannel: ``await channel.invoke_method("echo", "hi")``."""

    def __init__(self, name: str, client: Client, codec: Optional[MethodCodec] = None) -> None:
        self.name = name
        self.client = client
        self.codec = codec or StandardMethodCodec()

    async def invoke_method(self, method: str, arguments: Any = None) -> Any:
        """Calls `method` and returns its result.

        Raises :class:`PlatformException` for an error result (its subclass :class:`ServerError` when the
        server itself answered with an ERROR, such as a refusal) and :class:`MissingPluginException` when
        the method is not implemented or nobody handles the channel.
        """
        payload = self.codec.encode_method_call(MethodCall(method, arguments))
        reply = await self.client.request(FrameType.MESSAGE, self.name, payload)
        if reply.payload is None:
            raise MissingPluginException(f"No implementation found for method {method} on channel {self.name}")
        return self.codec.decode_envelope(reply.payload)

    async def set_method_call_handler(self, handler: Optional[MethodCallHandler]) -> None:
        """Handles this channel's calls from every other client (REGISTER), or gives it back (None).

        `handler` gets a :class:`MethodCall` and returns the result (or a coroutine of it). Raising
        :class:`PlatformException` answers an error, :class:`MissingPluginException` "not implemented";
        any other exception an error with code ``error``, as Flutter does. A call the caller cancels
        cancels the handler's task.
        """
        if handler is None:
            await self.client.unregister(self.name)
            return
        codec = self.codec

        async def answer(payload: Optional[bytes]) -> Optional[bytes]:
            try:
                call = codec.decode_method_call(payload)
                return codec.encode_success_envelope(await _call(handler, call))
            except PlatformException as error:
                return codec.encode_error_envelope(error.code, error.message, error.details, error.stacktrace)
            except MissingPluginException:
                return None
            except asyncio.CancelledError:
                return codec.encode_error_envelope("cancelled", "the call was cancelled")
            except Exception as error:  # the caller gets it as Flutter's `error` code
                return codec.encode_error_envelope("error", str(error))

        await self.client.register(self.name, answer, _declaration("method", codec))


class BasicMessageChannel:
    """Flutter's BasicMessageChannel: ``await channel.send(message)`` returns the reply."""

    def __init__(self, name: str, codec: MessageCodec, client: Client) -> None:
        self.name = name
        self.codec = codec
        self.client = client

    async def send(self, message: Any) -> Any:
        """Sends `message` and returns the reply (None also when nobody handles the channel)."""
        reply = await self.client.request(FrameType.MESSAGE, self.name, self.codec.encode_message(message))
        return self.codec.decode_message(reply.payload)

    async def set_message_handler(self, handler: Optional[MessageHandler]) -> None:
        """Handles this channel's messages from every other client (REGISTER), or gives it back (None).
        `handler` gets the message and returns the reply (or a coroutine of it)."""
        if handler is None:
            await self.client.unregister(self.name)
            return
        codec = self.codec

        async def answer(payload: Optional[bytes]) -> Optional[bytes]:
            try:
                return codec.encode_message(await _call(handler, codec.decode_message(payload)))
            except asyncio.CancelledError:
                return None  # the server has already answered the cancelled sender
        await self.client.register(self.name, answer, _declaration("message", codec))


class EventChannel:
    """Flutter's EventChannel: ``async for event in channel.receive_broadcast_stream(arguments)``."""

    def __init__(self, name: str, client: Client, codec: Optional[MethodCodec] = None) -> None:
        self.name = name
        self.client = client
        self.codec = codec or StandardMethodCodec()

    def receive_broadcast_stream(self, arguments: Any = None, *, credit: Optional[int] = None) -> "EventStream":
        """The channel's stream of events for `arguments`. It listens on first use (``async for``,
        ``async with`` or :meth:`EventStream.listen`); `credit`, when given, is sent as DEMAND first
        so the server sends at most that many events until :meth:`EventStream.request` grants more."""
        return EventStream(self, arguments, credit)


class _StreamState:
    """What the client delivers to one listened stream: its event payloads, in order, then its end."""

    __slots__ = ("channel", "payloads", "ended", "error", "wakeup", "cancelling", "listen_payload", "codec")

    def __init__(self, channel: str, listen_payload: Optional[bytes] = None, codec: Optional[MethodCodec] = None) -> None:
        self.channel = channel
        self.listen_payload = listen_payload  # what a resumable client sends to listen again on a new session
        self.codec = codec
        self.payloads: deque = deque()
        self.ended = False  # no more payloads will come
        self.error: Optional[BaseException] = None  # raised once the payloads run out
        self.wakeup: Optional[asyncio.Future] = None
        self.cancelling = False

    def deliver(self, payload: Optional[bytes]) -> None:
        if self.ended:
            return
        self.payloads.append(payload)
        if payload is None:
            self.ended = True
        self._wake()

    def finish(self, error: Optional[BaseException] = None) -> None:
        """Ends the stream without an end-of-stream event (cancelled, superseded, or the connection ended)."""
        if not self.ended:
            self.ended = True
            self.error = error
        self._wake()

    def connection_ended(self, error: ConnectionClosedError) -> None:
        self.finish(error)

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)


class EventStream:
    """The events of one stream, as an async iterator (Flutter's broadcast stream, listened once).

    - Each success event is the next item; an error event raises :class:`PlatformException` from
      ``__anext__``. The stream goes on listening: iterate again to read past the error (``async for``
      leaves the loop on the exception, as Dart's ``await for`` does).
    - The end of the stream ends the iteration.
    - Leaving early cancels the stream (a ``cancel`` call): at once on ``break`` out of ``async with``,
      or ``await stream.aclose()``; when an ``async for`` over ``receive_broadcast_stream(...)`` itself
      is left, the stream object is dropped and cancels at once (CPython frees it there).
    - If the connection ends, the events that came are still read; then :class:`ConnectionClosedError`.
    """

    def __init__(self, channel: EventChannel, arguments: Any, credit: Optional[int]) -> None:
        self.channel = channel
        self.arguments = arguments
        self._credit = credit
        self._state: Optional[_StreamState] = None
        self._listening: Optional[asyncio.Task] = None

    @property
    def _client(self) -> Client:
        return self.channel.client

    async def listen(self) -> None:
        """Sends ``listen`` and waits for its answer; an error answer (the stream was refused) raises
        :class:`PlatformException`. Called by the first iteration if not before; later calls do nothing."""
        if self._listening is None:
            self._listening = asyncio.ensure_future(self._listen())
        await asyncio.shield(self._listening)

    async def _listen(self) -> None:
        client, name, codec = self._client, self.channel.name, self.channel.codec
        if self._credit is not None:
            await client.demand(name, self._credit)
        payload = codec.encode_method_call(MethodCall("listen", self.arguments))
        state = _StreamState(name, payload, codec)

        def on_answer(frame: Any) -> None:
            # Runs as the REPLY is read: events of an earlier stream on the channel came before it.
            try:
                codec.decode_envelope(frame.payload)
            except (PlatformException, FormatError):
                return  # refused (or not implemented): the earlier stream, if any, goes on
            previous = client._streams.get(name)
            if previous is not None:
                previous.finish()  # a second listen ends the first silently (wire-v1 section 3)
            client._streams[name] = state

        reply = await client.request(FrameType.MESSAGE, name, payload, on_answer)
        if reply.payload is None:
            raise MissingPluginException(f"No implementation found for method listen on channel {name}")
        codec.decode_envelope(reply.payload)  # raises the refusal
        self._state = state

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        await self.listen()
        state = self._state
        while not state.payloads:
            if state.ended:
                if state.error is not None:
                    raise state.error
                raise StopAsyncIteration
            state.wakeup = asyncio.get_running_loop().create_future()
            await state.wakeup
        payload = state.payloads.popleft()
        if payload is None:
            self._forget()
            raise StopAsyncIteration
        return self.channel.codec.decode_envelope(payload)

    async def request(self, credit: int) -> None:
        """Grants `credit` more events (DEMAND); 0xFFFFFFFF returns the stream to push mode."""
        await self._client.demand(self.channel.name, credit)

    async def cancel(self) -> None:
        """Sends ``cancel`` and waits for its answer; afterwards no event of this stream arrives. Raises
        :class:`PlatformException` if the server has no active stream to cancel (it ended)."""
        state = self._active_state()
        if state is None:
            return
        state.cancelling = True
        try:
            reply = await self._client.request(FrameType.MESSAGE, self.channel.name, self._cancel_payload(),
                                               self._on_cancel_answer(state))
            if reply.payload is not None:
                self.channel.codec.decode_envelope(reply.payload)
        finally:
            state.finish()

    async def aclose(self) -> None:
        """Cancels the stream if it is still active, ignoring an error answer and a closed connection."""
        try:
            await self.cancel()
        except (PlatformException, ConnectionClosedError):
            pass

    async def __aenter__(self) -> "EventStream":
        await self.listen()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", None) is None:
            return  # never listened (or only partly made)
        state = self._active_state()
        client = self._client
        if state is None or not client.is_open or client._loop is None or client._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is client._loop:
            self._cancel_now(state)
        else:
            client._loop.call_soon_threadsafe(self._cancel_now, state)

    # MARK: Internals

    def _active_state(self) -> Optional[_StreamState]:
        """The stream's state while it is the channel's active stream and not being cancelled."""
        state = self._state
        if state is None or state.ended or state.cancelling or self._client._streams.get(self.channel.name) is not state:
            return None
        return state

    def _cancel_payload(self) -> bytes:
        return self.channel.codec.encode_method_call(MethodCall("cancel", self.arguments))

    def _on_cancel_answer(self, state: _StreamState) -> Callable[[Any], None]:
        streams, name = self._client._streams, self.channel.name

        def on_answer(_frame: Any) -> None:
            if streams.get(name) is state:
                del streams[name]
                self._client._credit.pop(name, None)  # credit ends with its stream
            state.finish()
        return on_answer

    def _cancel_now(self, state: _StreamState) -> None:
        """Writes ``cancel`` without waiting for its answer (the stream was dropped)."""
        if state is not self._active_state() or not self._client.is_open:
            return
        state.cancelling = True
        _, future = self._client._send_request(FrameType.MESSAGE, self.channel.name, self._cancel_payload(),
                                               self._on_cancel_answer(state))
        future.add_done_callback(_ignore_outcome)

    def _forget(self) -> None:
        streams = self._client._streams
        if streams.get(self.channel.name) is self._state:
            del streams[self.channel.name]
