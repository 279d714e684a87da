"""Resumable sessions (protocol/resumption.md) against a live server, on one loop and on four, through a proxy that
cuts connections at random byte offsets. Each test prints its proxy's seed: SWITCHBOARD_CUT_SEED=<seed> repeats it.
HANG_GUARD=<seconds> (60 by default) shortens the guard against a hang when debugging one."""

import asyncio
import os
import ssl
import subprocess
from pathlib import Path
import hashlib
import json
from collections import Counter

import pytest

import switchboard
from switchboard import EventChannel, MethodChannel, SessionLostError
from switchboard.cutting_proxy import CuttingProxy
from switchboard.wire import Frame, FrameType, encode_frame

ROOT = Path(__file__).resolve().parents[3]
LOOPS = pytest.mark.parametrize("loops", [1, 4], ids=["loops1", "loops4"])
# Each connection through a random-cutting proxy is reset after forwarding this many bytes (both ways): at
# least 400, so that the first HELLO and WELCOME (about 330 bytes) pass, as the first connect is not resumable.
CUTS = (400, 6000)


async def within(awaitable):
    """Guards against a hang (a lost frame would leave a call or a stream waiting); never reached when it works."""
    return await asyncio.wait_for(awaitable, float(os.environ.get("HANG_GUARD", 60)))


async def collect(stream):
    return [event async for event in stream]


def serve(factory, loops, *args):
    return factory("--loops", loops, *args)


async def stats(client):
    return (await MethodChannel("switchboard/stats", client).invoke_method("get"))["sessions"]


async def ended(observer, reason):
    """Returns once the server has ended a session for `reason`."""
    while (await stats(observer))["ended"].get(reason, 0) < 1:
        await asyncio.sleep(0.02)  # polls the server's count: there is no event to await


async def next_event(client, index=0):
    """The client's `index`-th session event, once it has come."""
    async for event in client.session_events():
        if index == 0:
            return event
        index -= 1
    raise AssertionError(f"the client closed without session event {index}: {client.session_reports}")


async def count_calls(holder, channel):
    """Registers `channel` on `holder`: it answers `add1` with the argument plus one, counting the arguments it saw."""
    seen = Counter()

    async def handle(call):
        seen[call.arguments] += 1
        return call.arguments + 1

    await MethodChannel(channel, holder).set_method_call_handler(handle)
    return seen


# MARK: Resuming through random cuts

@LOOPS
async def test_numbered_events_arrive_without_gap_or_duplicate(switchboard_server_factory, switchboard_cut_seed, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port, seed=switchboard_cut_seed, cut_after=CUTS) as proxy:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as client:
            assert client.session is not None
            ticker = EventChannel("switchboard/ticker", client)
            events = await within(collect(ticker.receive_broadcast_stream({"count": 3000, "intervalMs": 0})))
            assert events == list(range(3000))
            kinds = {event.kind for event in client.session_reports}
        assert proxy.cuts >= 5 and kinds == {"resumed"}, (proxy.cuts, client.session_reports)


async def test_a_stream_over_tls_resumes_through_cuts(switchboard_server_factory, switchboard_cut_seed, tmp_path):
    """One loop: a resume over TLS that lands on another loop is not served yet (protocol/resumption.md). The cuts
    come later than over TCP: a TLS record (up to 16 KiB, and the server writes what it replays at once) is read
    whole or not at all, so a connection must live past its handshake (about 2.3 KB) and a whole record. The stream
    is about 110 KB over TLS and no connection forwards more than 30 KB, so there are at least three cuts."""
    subprocess.run([str(ROOT / "scripts" / "make-test-certs"), str(tmp_path)], check=True)
    server = serve(switchboard_server_factory, 1, "--tls-cert", tmp_path / "server.pem", "--tls-key", tmp_path / "server.key")
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    async with CuttingProxy(server.host, server.tls_port, seed=switchboard_cut_seed, cut_after=(20000, 30000)) as proxy:
        async with await switchboard.connect(proxy.host, proxy.port, ssl=context, server_hostname="localhost",
                                             resumable=True) as client:
            ticker = EventChannel("switchboard/ticker", client)
            events = await within(collect(ticker.receive_broadcast_stream({"count": 3000, "intervalMs": 0})))
            assert events == list(range(3000))
            assert {event.kind for event in client.session_reports} == {"resumed"}
        assert proxy.cuts >= 3


@LOOPS
async def test_a_paced_stream_keeps_its_credit_through_cuts(switchboard_server_factory, switchboard_cut_seed, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port, seed=switchboard_cut_seed, cut_after=CUTS) as proxy:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as client:
            stream = EventChannel("switchboard/ticker", client).receive_broadcast_stream(
                {"count": 1000, "intervalMs": 0}, credit=10)
            events = []
            async for event in stream:
                events.append(event)
                if len(events) % 10 == 0:
                    await within(stream.request(10))
            assert events == list(range(1000))
            assert {event.kind for event in client.session_reports} == {"resumed"}
        assert proxy.cuts >= 3


@LOOPS
async def test_calls_in_flight_at_a_cut_get_exactly_one_real_answer(switchboard_server_factory, switchboard_cut_seed, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port, seed=switchboard_cut_seed, cut_after=CUTS) as proxy, \
            await server.connect() as holder:
        seen = await count_calls(holder, "test/count")
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as caller:
            channel = MethodChannel("test/count", caller)
            for batch in range(6):
                numbers = range(batch * 100, batch * 100 + 100)
                answers = await within(asyncio.gather(*(channel.invoke_method("add1", n) for n in numbers)))
                assert answers == [n + 1 for n in numbers]
            assert {event.kind for event in caller.session_reports} == {"resumed"}
        assert seen == Counter(range(600)), "every call ran exactly once"
        assert proxy.cuts >= 5


@LOOPS
async def test_a_holder_cut_at_random_answers_every_call_once(switchboard_server_factory, switchboard_cut_seed, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port, seed=switchboard_cut_seed, cut_after=CUTS) as proxy, \
            await server.connect() as caller:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as holder:
            seen = await count_calls(holder, "test/count")
            channel = MethodChannel("test/count", caller)
            for batch in range(4):
                numbers = range(batch * 100, batch * 100 + 100)
                answers = await within(asyncio.gather(*(channel.invoke_method("add1", n) for n in numbers)))
                assert answers == [n + 1 for n in numbers]
            assert {event.kind for event in holder.session_reports} == {"resumed"}
        assert seen == Counter(range(400))
        assert proxy.cuts >= 3


@LOOPS
async def test_a_holder_cut_mid_request_answers_after_resuming(switchboard_server_factory, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port) as proxy, await server.connect() as caller:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as holder:
            started, release = asyncio.Event(), asyncio.Event()

            async def handle(call):
                if call.method == "slow":
                    started.set()
                    await release.wait()
                return call.arguments + 1

            await MethodChannel("test/slow", holder).set_method_call_handler(handle)
            call = asyncio.ensure_future(MethodChannel("test/slow", caller).invoke_method("slow", 41))
            await asyncio.wait_for(started.wait(), 30)  # guards against a hang, never reached when it works
            assert proxy.cut() == 1
            release.set()  # the REPLY is made while the holder has no connection
            assert await asyncio.wait_for(call, 30) == 42
            assert await next_event(holder) == switchboard.SessionEvent("resumed")
            assert await MethodChannel("test/slow", caller).invoke_method("fast", 1) == 2  # and it goes on answering


@LOOPS
async def test_a_fast_producer_stays_within_the_clients_bound(switchboard_server_factory, switchboard_cut_seed, loops):
    """A holder sends events as fast as it may through random cuts: what it keeps unacknowledged never passes its
    `session_bytes` (sending waits instead), and its listener gets every event once, in order."""
    server = serve(switchboard_server_factory, loops)
    codec = switchboard.StandardMethodCodec()
    bound = 8192
    async with CuttingProxy(server.host, server.port, seed=switchboard_cut_seed, cut_after=CUTS) as proxy, \
            await server.connect() as listener:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True, session_bytes=bound) as holder:
            listened = asyncio.Event()

            async def handle(payload):
                listened.set()
                return codec.encode_success_envelope(None)

            await holder.register("test/numbers", handle, {"kind": "event", "codec": "standard"})
            stream = EventChannel("test/numbers", listener).receive_broadcast_stream()
            await stream.listen()
            await asyncio.wait_for(listened.wait(), 30)
            most = 0
            for n in range(1000):
                await within(holder.send("test/numbers", codec.encode_success_envelope(n)))
                most = max(most, holder._session.sent - holder._session.acked)
            await holder.send("test/numbers", None)
            assert 0 < most <= bound
            assert await within(collect(stream)) == list(range(1000))
        assert proxy.cuts >= 3


async def test_a_sender_waiting_for_room_goes_on_when_the_resume_acknowledges(switchboard_server_factory):
    """A send past the bound waits for the server's acknowledgement; a cut before the POSITION comes leaves the
    WELCOME of the resume to acknowledge it, and the sender goes on."""
    server = serve(switchboard_server_factory, 1)
    async with CuttingProxy(server.host, server.port) as proxy, await server.connect() as listener:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True, session_bytes=100) as holder:
            listened = asyncio.Event()

            async def handle(payload):
                listened.set()
                return switchboard.StandardMethodCodec().encode_success_envelope(None)

            await holder.register("test/big", handle, {"kind": "event", "codec": "standard"})
            stream = EventChannel("test/big", listener).receive_broadcast_stream()
            await stream.listen()
            await within(listened.wait())
            event = switchboard.StandardMethodCodec().encode_success_envelope(b"x" * 200)
            sending = asyncio.ensure_future(holder.send("test/big", event))
            assert await within(stream.__anext__()) == b"x" * 200  # the server has it; its POSITION comes in 1 s
            assert not sending.done()
            proxy.cut()
            await within(sending)
            assert await next_event(holder) == switchboard.SessionEvent("resumed")


# MARK: When a session cannot be resumed

async def open_world(server, proxy):
    """A resumable client through `proxy` that listens to a ticker, holds `test/held`, and has a call written to a
    holder that does not answer; and that holder, on its own connection."""
    holder = await server.connect()
    started = asyncio.Event()

    async def never(call):
        started.set()
        await asyncio.Event().wait()

    await MethodChannel("test/never", holder).set_method_call_handler(never)
    client = await switchboard.connect(proxy.host, proxy.port, resumable=True)
    await MethodChannel("test/held", client).set_method_call_handler(lambda call: "held")
    stream = EventChannel("switchboard/ticker", client).receive_broadcast_stream({"intervalMs": 2})
    assert await stream.__anext__() == 0
    call = asyncio.ensure_future(MethodChannel("test/never", client).invoke_method("wait"))
    await asyncio.wait_for(started.wait(), 30)
    return client, holder, stream, call


async def assert_fell_back(server, client, stream, call, reason, held_again=True):
    event = await asyncio.wait_for(next_event(client), 30)
    assert (event.kind, event.reason, event.streams, event.channels) == (
        "restarted", reason, ("switchboard/ticker",), ("test/held",))
    with pytest.raises(SessionLostError) as raised:
        await call
    assert (raised.value.code, raised.value.reason) == ("session_lost", reason)
    assert [(failed.channel) for failed in event.failed] == ["test/never"]
    assert not isinstance(raised.value, switchboard.ConnectionClosedError)
    assert client.session is not None and client.is_open  # a new session
    async for tick in stream:  # listened again: the ticker counts from 0 on the new listen
        if tick == 0:
            break
    if held_again:
        async with await server.connect() as other:  # the channel is held again
            assert await MethodChannel("test/held", other).invoke_method("who") == "held"
    assert await MethodChannel("switchboard/echo", client).invoke_method("echo", 7) == 7


def tampered(token):
    """The token with a character of its secret (its last 16 bytes) changed."""
    return token[:30] + ("B" if token[30] != "B" else "C") + token[31:]


@LOOPS
@pytest.mark.parametrize("presented, ending, reason, options", [
    (lambda token: token, "expired", "expired", ()),
    (tampered, "expired", "unknown", ()),
    (lambda token: "A" * 43, "expired", "restarted", ()),  # a token of a server process this one does not know
    (lambda token: token, "overflowed", "overflowed", ("--session-bytes", "4096")),  # ticks fill the parked session
], ids=["own", "tampered", "foreign", "overflowed"])
async def test_a_session_that_cannot_be_resumed_makes_the_client_fall_back(switchboard_server_factory, loops,
                                                                           presented, ending, reason, options):
    server = serve(switchboard_server_factory, loops, "--session-ttl", "1000", *options)
    async with CuttingProxy(server.host, server.port) as proxy, await server.connect() as observer:
        client, holder, stream, call = await open_world(server, proxy)
        async with client, holder:
            client._session.token = presented(client._session.token)
            proxy.hold()  # the client's next try waits in the proxy while its session ends
            proxy.cut()
            await within(proxy.wait_accepted(2))
            # A call made without a connection is not lost: it goes on the new session.
            later = asyncio.ensure_future(MethodChannel("switchboard/echo", client).invoke_method("echo", "later"))
            await within(ended(observer, ending))
            proxy.release()
            await assert_fell_back(server, client, stream, call, reason)
            assert await within(later) == "later"
            assert (await stats(observer))["refused"] == {reason: 1}


@pytest.mark.parametrize("sessions, reason", [(True, "restarted"), (False, "unsupported")], ids=["restarted", "unsupported"])
async def test_a_server_restart_makes_the_client_fall_back(switchboard_server_factory, sessions, reason):
    first = serve(switchboard_server_factory, 1)
    async with CuttingProxy(first.host, first.port) as proxy:
        client, holder, stream, call = await open_world(first, proxy)
        async with client:
            proxy.hold()
            proxy.cut()
            await holder.close()
            assert await asyncio.to_thread(first.stop) == 0
            second = serve(switchboard_server_factory, 1, "--port", first.port,
                           *(() if sessions else ("--session-ttl", "0")))
            await within(proxy.wait_accepted(2))
            proxy.release()
            event = await within(next_event(client))
            assert (event.kind, event.reason, event.streams, event.channels) == (
                "restarted", reason, ("switchboard/ticker",), ("test/held",))
            with pytest.raises(SessionLostError):
                await call
            assert (client.session is not None) is sessions
            async for tick in stream:  # listened again on the new server
                if tick == 0:
                    break
            async with await second.connect() as other:
                assert await MethodChannel("test/held", other).invoke_method("who") == "held"


async def test_a_client_that_cannot_reach_the_server_again_reports_the_end(switchboard_server_factory):
    server = serve(switchboard_server_factory, 1, "--session-ttl", "300")
    async with CuttingProxy(server.host, server.port) as proxy:
        client, holder, stream, call = await open_world(server, proxy)
        async with client, holder:
            proxy.refuse()
            proxy.cut()
            event = await asyncio.wait_for(next_event(client), 30)
            assert (event.kind, event.reason, event.streams) == ("ended", "expired", ("switchboard/ticker",))
            with pytest.raises(SessionLostError):
                await call
            assert not client.is_open
            with pytest.raises(switchboard.ConnectionClosedError):
                async for _ in stream:
                    pass


@LOOPS
async def test_a_session_taken_over_makes_the_client_fall_back(switchboard_server_factory, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port) as proxy:
        client, holder, stream, call = await open_world(server, proxy)
        async with client, holder:
            welcome = await resume_raw(server, {"version": 1}, client.session["token"])
            assert welcome["session"]["resumed"] is True
            # The taker's session (parked once it closes) keeps `test/held`: registering it again is refused.
            await assert_fell_back(server, client, stream, call, "taken", held_again=False)


@LOOPS
async def test_a_late_resuming_hello_of_the_clients_own_is_not_a_theft(switchboard_server_factory, loops):
    """A connection the client gave up with its resuming HELLO unanswered, whose HELLO reaches the server after a
    later connection resumed, takes the session over: the client resumes again rather than give the session up as
    `taken`, and a call in flight gets its real answer."""
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port) as proxy, await server.connect() as holder:
        answers = asyncio.Event()
        reached = asyncio.Event()

        async def slow(call):
            reached.set()
            await answers.wait()
            return call.arguments

        await MethodChannel("test/slow", holder).set_method_call_handler(slow)
        client = await switchboard.connect(proxy.host, proxy.port, resumable=True, timeout=0.3)
        async with client:
            proxy.hold()
            proxy.cut()
            await within(proxy.wait_accepted(2))  # the resuming HELLO, held in the proxy; given up after 0.3 s
            proxy.hold(False)
            assert (await within(next_event(client))).kind == "resumed"  # on the third connection
            call = asyncio.ensure_future(MethodChannel("test/slow", client).invoke_method("wait", 7))
            await within(reached.wait())
            proxy.release(2)  # the late HELLO takes the session from the third connection
            assert (await within(next_event(client, 1))).kind == "resumed", client.session_reports
            answers.set()
            assert await within(call) == 7
            assert [event.kind for event in client.session_reports] == ["resumed", "resumed"]


async def listens(client):
    """The `listens` of the resumable client's connection, from the server's introspection channel."""
    page = await MethodChannel("switchboard/connections", client).invoke_method("list")
    [mine] = [c for c in page["connections"] if c["listens"]]
    return mine["listens"]


@LOOPS
async def test_a_fallback_listens_again_with_the_outstanding_credit(switchboard_server_factory, loops):
    server = serve(switchboard_server_factory, loops)
    codec = switchboard.StandardMethodCodec()
    async with CuttingProxy(server.host, server.port) as proxy, await server.connect() as observer, \
            await server.connect() as holder:
        listens_seen = asyncio.Queue()

        async def handle(payload):
            listens_seen.put_nowait(codec.decode_method_call(payload).method)
            return codec.encode_success_envelope(None)

        await holder.register("test/paced", handle, {"kind": "event", "codec": "standard"})
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as client:
            stream = EventChannel("test/paced", client).receive_broadcast_stream(credit=3)
            await stream.listen()
            assert await within(listens_seen.get()) == "listen"
            await holder.send("test/paced", codec.encode_success_envelope("before"))
            assert await within(stream.__anext__()) == "before"  # 2 of the credit left
            client._session.token = tampered(client._session.token)
            proxy.cut()
            event = await within(next_event(client))
            assert (event.kind, event.reason, event.streams) == ("restarted", "unknown", ("test/paced",))
            # Reported once listened again (the holder is not asked again: the parked session still listens).
            for n in range(5):
                await holder.send("test/paced", codec.encode_success_envelope(n))
            assert [await within(stream.__anext__()) for _ in range(2)] == [0, 1]
            assert await listens(observer) == [{"channel": "test/paced", "credit": 0}]
            await stream.request(1)
            assert await within(stream.__anext__()) == 2


@LOOPS
async def test_a_fallback_with_no_credit_left_listens_again_once_credit_comes(switchboard_server_factory, loops):
    server = serve(switchboard_server_factory, loops)
    async with CuttingProxy(server.host, server.port) as proxy, await server.connect() as observer:
        async with await switchboard.connect(proxy.host, proxy.port, resumable=True) as client:
            stream = EventChannel("switchboard/ticker", client).receive_broadcast_stream({"intervalMs": 0}, credit=1)
            assert await stream.__anext__() == 0
            client._session.token = tampered(client._session.token)
            proxy.cut()
            event = await within(next_event(client))
            assert (event.kind, event.reason, event.streams) == ("restarted", "unknown", ("switchboard/ticker",))
            page = await MethodChannel("switchboard/connections", observer).invoke_method("list")
            assert [c["listens"] for c in page["connections"] if c["listens"]] == []  # not listened again yet
            await stream.request(2)
            assert [await within(stream.__anext__()) for _ in range(2)] == [0, 1]
            assert await listens(observer) == [{"channel": "switchboard/ticker", "credit": 0}]


async def test_closing_ends_the_session(switchboard_server_factory):
    server = serve(switchboard_server_factory, 1)
    async with await server.connect() as observer:
        client = await server.connect(resumable=True)
        await client.close()
        await within(ended(observer, "end"))
        assert (await stats(observer))["parked"] == 0


async def test_a_server_without_sessions_gives_a_plain_connection(switchboard_server_factory):
    server = switchboard_server_factory("--session-ttl", "0")
    async with await switchboard.connect(server.host, server.port, resumable=True) as client:
        assert client.session is None
        assert await MethodChannel("switchboard/echo", client).invoke_method("echo", 1) == 1


# MARK: Access control

async def resume_raw(server, hello, token):
    """Sends a resuming HELLO for `token` on a new connection: the WELCOME's payload, or the ERROR's as a ServerError."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        hello = dict(hello, session={"token": token, "position": 0})
        writer.write(encode_frame(Frame(FrameType.HELLO, 1, "", json.dumps(hello).encode())))
        header = await reader.readexactly(12)
        body = await reader.readexactly(int.from_bytes(header[:4], "big") - 8)
        payload = json.loads(body)
        if header[4] == FrameType.ERROR:
            raise switchboard.ServerError.of(payload["code"], payload.get("message"), payload.get("details"))
        assert header[4] == FrameType.WELCOME
        return payload
    finally:
        writer.close()


@LOOPS
async def test_another_users_token_is_refused(tmp_path, switchboard_server_factory, loops):
    config = {"access": {"users": [{"name": name, "tokenSha256": hashlib.sha256(name.encode()).hexdigest()}
                                   for name in ("alice", "bob")],
                         "anonymous": {"allow": {"call": ["switchboard/echo"]}}}}
    path = tmp_path / "switchboard.json"
    path.write_text(json.dumps(config))
    server = serve(switchboard_server_factory, loops, "--config", path)
    async with CuttingProxy(server.host, server.port) as proxy:
        async with await switchboard.connect(proxy.host, proxy.port, token="alice", resumable=True) as alice:
            token = alice.session["token"]
            for hello in ({"version": 1, "token": "bob"}, {"version": 1}):
                with pytest.raises(switchboard.ServerError) as raised:
                    await resume_raw(server, hello, token)
                assert (raised.value.code, raised.value.details) == ("cannot_resume", {"reason": "unknown"})
            assert await alice.ping(b"still mine") == b"still mine"
            assert alice.session_reports == []  # not taken over
            proxy.cut()
            assert await next_event(alice) == switchboard.SessionEvent("resumed")  # and alice still resumes it
            async with await server.connect(token="alice") as observer:
                assert (await stats(observer))["refused"]["identity"] == 2


@pytest.mark.switchboard_client(resumable=True)
async def test_the_client_fixture_takes_connect_options(switchboard_client):
    assert switchboard_client.session["ttlMs"] == 60000 and switchboard_client.session_reports == []


async def test_the_servers_end_leaves_a_plain_connection():
    """A fake server grants a session, then ends it (END, overflowed): the client reports `ended` with the stream
    it had, goes on over the same connection without a session, and a drop then closes it."""
    received = []
    done = asyncio.Event()

    async def fake_server(reader, writer):
        async def read():
            header = await reader.readexactly(12)
            body = await reader.readexactly(int.from_bytes(header[:4], "big") - 8)
            return Frame(header[4], int.from_bytes(header[8:12], "big"), body[:int.from_bytes(header[6:8], "big")].decode())

        hello = await read()
        session = {"token": "t" * 43, "resumed": False, "position": 0, "ttlMs": 60000, "ackBytes": 1, "ackMs": 1}
        writer.write(encode_frame(Frame(FrameType.WELCOME, hello.id, "", json.dumps({"version": 1, "session": session}).encode())))
        listen = await read()
        writer.write(encode_frame(Frame(FrameType.REPLY, listen.id, "", b"\x00\x00")))  # success, null
        writer.write(encode_frame(Frame(FrameType.END, 0, "", b'{"reason":"overflowed"}')))
        while True:
            frame = await read()
            received.append(frame.type)
            if frame.type == FrameType.PING:  # the client's: answered, then the server PINGs
                writer.write(encode_frame(Frame(FrameType.PONG, frame.id)))
                writer.write(encode_frame(Frame(FrameType.PING, 0)))
            elif frame.type == FrameType.PONG:
                break
        writer.close()
        done.set()

    listening = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    async with listening:
        client = await switchboard.connect("127.0.0.1", listening.sockets[0].getsockname()[1], resumable=True)
        async with client:
            stream = EventChannel("fake/events", client).receive_broadcast_stream()
            await stream.listen()
            event = await within(next_event(client))
            assert event == switchboard.SessionEvent("ended", "overflowed", streams=("fake/events",))
            assert client.session is None
            assert await within(client.ping()) is None
            await within(done.wait())
            # The REPLY was acknowledged (ackBytes 1) before END came; nothing is after it (the PONG).
            assert received == [FrameType.POSITION, FrameType.PING, FrameType.PONG]
            while client.is_open:
                await asyncio.sleep(0.01)  # the close reaches the client: not resumed, as there is no session
            assert client.session_reports == [event]


async def test_a_resume_at_a_position_the_client_did_not_keep_falls_back():
    """A (broken) fake server resumes at a position past what the client sent: the client closes that connection and
    falls back, reason `position`, on a new connection with a new session."""
    hellos = []

    async def fake_server(reader, writer):
        header = await reader.readexactly(12)
        body = await reader.readexactly(int.from_bytes(header[:4], "big") - 8)
        hello = json.loads(body)
        hellos.append(hello.get("session"))
        session = {"token": "t" * 43, "resumed": "token" in hello["session"], "position": 10_000 if "token" in hello["session"] else 0,
                   "ttlMs": 60000, "ackBytes": 65536, "ackMs": 1000}
        writer.write(encode_frame(Frame(FrameType.WELCOME, 1, "", json.dumps({"version": 1, "session": session}).encode())))
        if len(hellos) == 1:
            writer.transport.abort()  # the first connection drops at once
            return
        try:
            await reader.read()  # the client closes the second; the third stays
        finally:
            writer.close()

    listening = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    async with listening:
        client = await switchboard.connect("127.0.0.1", listening.sockets[0].getsockname()[1], resumable=True)
        async with client:
            event = await within(next_event(client))
            assert (event.kind, event.reason) == ("restarted", "position")
            assert hellos == [{}, {"token": "t" * 43, "position": 0}, {}]
            assert client.session is not None
