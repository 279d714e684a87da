"""The client against a live server, started per test by the plugin's own fixtures."""

import array
import asyncio
import hashlib
import json
import ssl
import subprocess
from pathlib import Path

import pytest

import switchboard
from switchboard import (
    BasicMessageChannel, BinaryCodec, EventChannel, Int64, JSONMethodCodec, MethodCall, MethodChannel,
    StandardMessageCodec, StandardMethodCodec, StringCodec,
)

ROOT = Path(__file__).resolve().parents[3]


async def my_listens(client):
    """The `listens` of the test's own connection, from the server's introspection channel."""
    connections = MethodChannel("switchboard/connections", client)
    page = await connections.invoke_method("list")
    [mine] = [c for c in page["connections"] if c["client"] and c["client"].startswith("switchboard-python/")]
    return mine["listens"]


# MARK: Method channels

async def test_calls_return_results_with_flutter_types_intact(switchboard_client):
    echo = MethodChannel("switchboard/echo", switchboard_client)
    value = {"z": [1, Int64(2), 2.5, "s", None, True, b"\x00\xff"],
             "typed": [array.array("i", [-1, 2]), array.array("q", [3]), array.array("d", [1.5]), array.array("f", [2.0])],
             7: {"nested": []}}
    result = await echo.invoke_method("echo", value)
    assert result == value and list(result) == ["z", "typed", 7]
    assert type(result["z"][1]) is Int64 and type(result["z"][0]) is int
    codec = StandardMessageCodec()
    assert codec.encode_message(result) == codec.encode_message(value)


async def test_json_method_channel(switchboard_client):
    echo = MethodChannel("switchboard/echo.json", switchboard_client, codec=JSONMethodCodec())
    assert await echo.invoke_method("echo", {"b": [1, 2.5, None], "a": "x"}) == {"b": [1, 2.5, None], "a": "x"}
    with pytest.raises(switchboard.PlatformException) as raised:
        await echo.invoke_method("fail", {"why": 1})
    assert (raised.value.code, raised.value.details) == ("demo_error", {"why": 1})


async def test_an_error_result_raises_platform_exception(switchboard_client):
    echo = MethodChannel("switchboard/echo", switchboard_client)
    with pytest.raises(switchboard.PlatformException) as raised:
        await echo.invoke_method("fail", {"n": 1})
    error = raised.value
    assert (error.code, error.message, error.details) == ("demo_error", "requested failure", {"n": 1})
    assert not isinstance(error, switchboard.ServerError)


async def test_not_implemented_raises_missing_plugin_exception(switchboard_client):
    with pytest.raises(switchboard.MissingPluginException):
        await MethodChannel("switchboard/echo", switchboard_client).invoke_method("nope")
    with pytest.raises(switchboard.MissingPluginException):
        await MethodChannel("nobody/handles/this", switchboard_client).invoke_method("m")


async def test_an_undecodable_payload_is_a_server_error(switchboard_client):
    reply = MethodChannel("switchboard/echo", switchboard_client, codec=JSONMethodCodec())
    with pytest.raises(switchboard.ServerError) as raised:
        await reply.invoke_method("echo", "a JSON call on a standard-codec channel")
    assert raised.value.code == "bad_payload"


async def test_a_frame_over_the_servers_max_frame_is_refused_before_it_is_sent(switchboard_server_factory):
    server = switchboard_server_factory("--max-frame", "1024")
    async with await server.connect() as client:
        echo = MethodChannel("switchboard/echo", client)
        with pytest.raises(switchboard.FormatError):
            await echo.invoke_method("echo", b"x" * 1024)
        assert await echo.invoke_method("echo", b"x" * 100) == b"x" * 100  # the connection goes on


@pytest.mark.switchboard("--heartbeat", "50")
async def test_the_client_answers_the_servers_heartbeat(switchboard_client):
    # Real time must pass here: the server closes a connection silent for two intervals (100 ms).
    await asyncio.sleep(0.4)
    assert await MethodChannel("switchboard/echo", switchboard_client).invoke_method("echo", 1) == 1


async def test_calls_answered_out_of_order_each_get_their_own_answer(switchboard_client):
    echo = MethodChannel("switchboard/echo", switchboard_client)
    assert await asyncio.gather(*(echo.invoke_method("echo", i) for i in range(200))) == list(range(200))
    assert await switchboard_client.ping(b"x") == b"x"


# MARK: Event channels

async def test_a_stream_yields_its_events_then_ends(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    events = [event async for event in ticker.receive_broadcast_stream({"count": 3, "intervalMs": 0})]
    assert events == [0, 1, 2]
    assert await my_listens(switchboard_client) == []


async def test_break_cancels_the_stream(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    async for event in ticker.receive_broadcast_stream({"intervalMs": 1}):
        if event == 2:
            break
    assert await my_listens(switchboard_client) == []


async def test_async_with_and_aclose_cancel_the_stream(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    async with ticker.receive_broadcast_stream({"intervalMs": 1}) as stream:
        assert [c["channel"] for c in await my_listens(switchboard_client)] == ["switchboard/ticker"]
        assert await stream.__anext__() == 0
    assert await my_listens(switchboard_client) == []
    stream = ticker.receive_broadcast_stream({"intervalMs": 1})
    assert await stream.__anext__() == 0
    await stream.aclose()
    assert await my_listens(switchboard_client) == []
    await stream.aclose()  # a second close does nothing


async def test_a_second_listen_on_the_channel_ends_the_first_stream(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    first = ticker.receive_broadcast_stream({"intervalMs": 1})
    assert await first.__anext__() == 0
    second = ticker.receive_broadcast_stream({"count": 2, "intervalMs": 0})
    await second.listen()
    assert [event async for event in second] == [0, 1]
    remaining = [event async for event in first]  # what came before the second listen's answer, then the end
    assert remaining == list(range(1, len(remaining) + 1))


async def test_credit_paces_a_stream(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    stream = ticker.receive_broadcast_stream({"count": 5, "intervalMs": 0}, credit=2)
    assert [await stream.__anext__(), await stream.__anext__()] == [0, 1]
    assert await my_listens(switchboard_client) == [{"channel": "switchboard/ticker", "credit": 0}]
    await stream.request(3)
    assert [event async for event in stream] == [2, 3, 4]


async def test_a_refused_listen_raises_platform_exception(switchboard_client):
    ticker = EventChannel("switchboard/ticker", switchboard_client)
    with pytest.raises(switchboard.PlatformException) as raised:
        async for _ in ticker.receive_broadcast_stream({"count": -1}):
            pass
    assert raised.value.code == "bad_arguments"


@pytest.mark.parametrize("codec_name", ["standard", "json"])
async def test_error_events_raise_and_the_stream_goes_on(switchboard_server, codec_name):
    """A client holds an event channel (REGISTER) and sends an event, an error event and the end."""
    codec = StandardMethodCodec() if codec_name == "standard" else JSONMethodCodec()
    async with await switchboard_server.connect() as holder, await switchboard_server.connect() as listener:
        listened = asyncio.Event()

        async def handle(payload):
            if codec.decode_method_call(payload).method == "listen":
                listened.set()
            return codec.encode_success_envelope(None)

        await holder.register("test/events", handle, {"kind": "event", "codec": codec_name})
        stream = EventChannel("test/events", listener, codec).receive_broadcast_stream()
        await stream.listen()
        await listened.wait()
        await holder.send("test/events", codec.encode_success_envelope("first"))
        await holder.send("test/events", codec.encode_error_envelope("sensor_down", "no signal", {"retry": True}))
        await holder.send("test/events", codec.encode_success_envelope("second"))
        await holder.send("test/events", None)
        received = []

        async def read_all():
            async for event in stream:
                received.append(event)

        with pytest.raises(switchboard.PlatformException) as raised:
            await asyncio.wait_for(read_all(), 30)  # guards against a hang, never reached when it works
        assert (raised.value.code, raised.value.message, raised.value.details) == (
            "sensor_down", "no signal", {"retry": True})
        await asyncio.wait_for(read_all(), 30)
        assert received == ["first", "second"]


async def test_a_stream_ends_when_the_server_shuts_down(switchboard_server):
    client = await switchboard_server.connect()
    stream = EventChannel("switchboard/ticker", client).receive_broadcast_stream({"intervalMs": 1})
    assert await stream.__anext__() == 0
    assert await asyncio.to_thread(switchboard_server.stop) == 0
    async for _ in stream:  # the events already sent, then the end of stream the server sends on shutdown
        pass
    assert client.goaway is not None
    with pytest.raises(switchboard.ConnectionClosedError) as raised:
        await client.ping()
    assert raised.value.goaway == client.goaway
    await client.close()


# MARK: Message channels

async def test_messages_in_every_codec(switchboard_client):
    standard = BasicMessageChannel("switchboard/message", StandardMessageCodec(), switchboard_client)
    message = {"b": Int64(1), "a": [1.0, None]}
    reply = await standard.send(message)
    assert reply == message and list(reply) == ["b", "a"] and type(reply["b"]) is Int64
    assert await standard.send(None) is None
    strings = BasicMessageChannel("switchboard/message.string", StringCodec(), switchboard_client)
    assert await strings.send("h\u00e9llo \U0001F600") == "h\u00e9llo \U0001F600"
    binary = BasicMessageChannel("switchboard/message.binary", BinaryCodec(), switchboard_client)
    assert await binary.send(b"\x00\x01") == b"\x00\x01"
    assert await binary.send(b"") == b""
    assert await binary.send(None) is None


async def test_room_posts_reach_listeners(switchboard_client):
    room = EventChannel("switchboard/room", switchboard_client)
    post = BasicMessageChannel("switchboard/room.post", BinaryCodec(), switchboard_client)
    async with room.receive_broadcast_stream() as stream:
        await post.send(b"hi")
        assert await stream.__anext__() == b"hi"


# MARK: Handlers (REGISTER)

async def test_a_registered_method_handler_answers_other_clients(switchboard_server):
    async with await switchboard_server.connect() as holder, await switchboard_server.connect() as caller:
        async def handle(call: MethodCall):
            if call.method == "add":
                return call.arguments[0] + call.arguments[1]
            if call.method == "refuse":
                raise switchboard.PlatformException("no", "not today", [1])
            if call.method == "crash":
                raise RuntimeError("boom")
            raise switchboard.MissingPluginException()

        await MethodChannel("test/math", holder).set_method_call_handler(handle)
        math = MethodChannel("test/math", caller)
        assert await math.invoke_method("add", [2, 3]) == 5
        with pytest.raises(switchboard.PlatformException) as raised:
            await math.invoke_method("refuse")
        assert (raised.value.code, raised.value.message, raised.value.details) == ("no", "not today", [1])
        with pytest.raises(switchboard.PlatformException) as raised:
            await math.invoke_method("crash")
        assert (raised.value.code, raised.value.message) == ("error", "boom")
        with pytest.raises(switchboard.MissingPluginException):
            await math.invoke_method("other")
        with pytest.raises(switchboard.ServerError) as raised:
            await MethodChannel("test/math", caller).set_method_call_handler(handle)
        assert raised.value.code == "channel_taken"
        await MethodChannel("test/math", holder).set_method_call_handler(None)
        with pytest.raises(switchboard.MissingPluginException):
            await math.invoke_method("add", [1, 1])


async def test_a_registered_message_handler(switchboard_server):
    async with await switchboard_server.connect() as holder, await switchboard_server.connect() as sender:
        await BasicMessageChannel("test/upper", StringCodec(), holder).set_message_handler(lambda text: text.upper())
        upper = BasicMessageChannel("test/upper", StringCodec(), sender)
        assert await upper.send("abc") == "ABC"
        assert await upper.send(None) is None  # the handler fails on None: the answer is a null reply


async def test_cancelling_a_call_sends_cancel_and_the_handler_is_cancelled(switchboard_server):
    async with await switchboard_server.connect() as holder, await switchboard_server.connect() as caller:
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def handle(call):
            started.set()
            try:
                await asyncio.Event().wait()  # never answers by itself
            except asyncio.CancelledError:
                cancelled.set()
                raise

        await MethodChannel("test/slow", holder).set_method_call_handler(handle)
        call = asyncio.ensure_future(MethodChannel("test/slow", caller).invoke_method("wait"))
        await asyncio.wait_for(started.wait(), 30)  # guards against a hang, never reached when it works
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(cancelled.wait(), 30)
        await caller.ping()
        assert caller._pending == {}  # the id was kept until the server's `cancelled` answer, then freed


# MARK: TLS, tokens, refusals

@pytest.fixture
def certificates(tmp_path):
    subprocess.run([str(ROOT / "scripts" / "make-test-certs"), str(tmp_path)], check=True)
    return tmp_path


async def test_tls(certificates, switchboard_server_factory):
    server = switchboard_server_factory("--tls-cert", certificates / "server.pem", "--tls-key", certificates / "server.key")
    assert server.tls_port not in (None, server.port)
    context = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
    async with await switchboard.connect("127.0.0.1", server.tls_port, ssl=context) as client:
        assert await MethodChannel("switchboard/echo", client).invoke_method("echo", "sealed") == "sealed"
    with pytest.raises(ssl.SSLCertVerificationError):
        await switchboard.connect("127.0.0.1", server.tls_port, ssl=ssl.create_default_context())


@pytest.mark.switchboard("--token", "s3cret")
async def test_a_token(switchboard_server, switchboard_client):
    assert await MethodChannel("switchboard/echo", switchboard_client).invoke_method("echo", 1) == 1
    for token in (None, "wrong"):
        with pytest.raises(switchboard.UnauthorizedError):
            await switchboard.connect(switchboard_server.host, switchboard_server.port, token=token)


def access_config(tmp_path):
    config = {
        "access": {
            "users": [{"name": "app", "tokenSha256": hashlib.sha256(b"app-token").hexdigest()}],
            "anonymous": {"allow": {"call": ["switchboard/echo", "switchboard/connections"], "listen": [], "send": []}},
        },
        "rateLimits": [{"channels": ["switchboard/echo"], "kinds": ["call"], "perConnection": {"rate": 1, "burst": 1}}],
    }
    path = tmp_path / "switchboard.json"
    path.write_text(json.dumps(config))
    return path


async def test_refusals_raise_their_own_exceptions(tmp_path, switchboard_server_factory):
    server = switchboard_server_factory("--config", access_config(tmp_path))
    async with await server.connect() as anonymous:
        with pytest.raises(switchboard.ForbiddenError) as raised:
            await EventChannel("switchboard/ticker", anonymous).receive_broadcast_stream().listen()
        assert raised.value.code == "forbidden" and isinstance(raised.value, switchboard.RefusedError)
        with pytest.raises(switchboard.ForbiddenError):
            await BasicMessageChannel("switchboard/message", StandardMessageCodec(), anonymous).send(1)
        echo = MethodChannel("switchboard/echo", anonymous)
        assert await echo.invoke_method("echo", 1) == 1
        with pytest.raises(switchboard.RateLimitedError) as raised:
            await echo.invoke_method("echo", 2)
        assert raised.value.code == "rate_limited" and 0 < raised.value.retry_after_ms <= 1000
        assert raised.value.details == {"retryAfterMs": raised.value.retry_after_ms}
        assert await anonymous.ping() is None  # the connection stays open
    async with await server.connect(token="app-token") as app:
        await EventChannel("switchboard/ticker", app).receive_broadcast_stream({"count": 1}).listen()
    with pytest.raises(switchboard.UnauthorizedError):
        await server.connect(token="not-a-user")
