#!/usr/bin/env python3
"""Resumable sessions' figures on a running server (started by scripts/bench-sessions): protocol/resumption.md.

  reconnect  A session listens to the room while a poster posts one event every POST_INTERVAL s. RECONNECTS
             times: the listener's connection is reset, CUT_GAP s pass (the parked session keeps the events
             posted meanwhile), then a new connection resumes it from the position received. Measured from
             the start of the new connection (TCP connect included) to the WELCOME and to the first
             replayed event; every event must arrive once, in order, across all the cuts.
  acks       Bytes of POSITION per 1,000 events, in both directions, for a session listener and a session
             poster (each acknowledging as the spec says: once ackBytes of the other side's stream arrived
             since the last POSITION, or ackMs after the first byte not yet acknowledged). Two rates: as fast
             as a window of FAST_WINDOW unanswered posts allows (FAST_EVENTS events), and SLOW_RATE events a
             second (SLOW_EVENTS events).

Prints the figures as Markdown rows; exits 1 if an event was lost, duplicated or out of order.
"""
import argparse
import asyncio
import struct
import sys
import time

sys.dont_write_bytecode = True
from sbwire import (END, ERROR, HELLO, MESSAGE, POSITION, REPLY, ROOM, ROOM_POST, WELCOME, FrameConnection, connect,
                    frame, hello_payload, json_of, method_call, percentile, position_frame)

RECONNECTS, POST_INTERVAL, CUT_GAP = 200, 0.005, 0.05
FAST_EVENTS, FAST_WINDOW, SLOW_EVENTS, SLOW_RATE, EVENT_SIZE = 100_000, 64, 1_000, 100, 100


def size_of(f):
    """A parsed frame's bytes on the wire (FrameParser's tuple: kind, flags, id, channel, payload)."""
    return 12 + len(f[3].encode()) + len(f[4] or b"")


def sequence(payload):
    """The sequence number a poster put first in a room event (a success envelope holding a Uint8List)."""
    return struct.unpack_from(">Q", payload, 3 if payload[2] < 254 else 5)[0]


class Acknowledging:
    """One side's acknowledgements of a session's stream (protocol/resumption.md, POSITION), on a
    FrameConnection whose frames it is shown; counts the POSITION bytes each way."""

    def __init__(self, conn, welcome):
        self.conn = conn
        session = welcome["session"]
        self.ack_bytes, self.ack_s = session["ackBytes"], session["ackMs"] / 1000.0
        self.received = self.told = 0
        self.untold_since = None
        self.sent_bytes = self.received_bytes = 0  # POSITION bytes written and read
        self.timer = None

    def frame(self, f):
        """Counts a frame read after the WELCOME; True if it is in the stream."""
        if f[0] in (POSITION, END):
            self.received_bytes += size_of(f) if f[0] == POSITION else 0
            return False
        self.received += size_of(f)
        if self.untold_since is None:
            self.untold_since = time.monotonic()
            self.timer = asyncio.get_running_loop().call_later(self.ack_s, self.due)
        if self.received - self.told >= self.ack_bytes:
            self.tell()
        return True

    def due(self):
        if self.untold_since is not None and self.received > self.told:
            self.tell()

    def tell(self):
        self.conn.send(position_frame(self.received))
        self.sent_bytes += 20
        self.told = self.received
        self.untold_since = None
        if self.timer:
            self.timer.cancel()
            self.timer = None


async def session_connection(port, name, on_stream_frame=None, resume=None):
    """A connection whose first frame asks for a session (or resumes `resume`: (token, position)); returns
    (connection, WELCOME's JSON, and the time from the start to the WELCOME). Frames after the WELCOME go
    to on_stream_frame(conn, frame), answers included."""
    welcome = asyncio.get_running_loop().create_future()

    def on_frame(conn, f):
        if not welcome.done():
            if f[0] in (WELCOME, ERROR) and f[2] == 0x7FFFFFFF:
                welcome.set_result((f[0], json_of(f[4]), time.perf_counter()))
            return
        if on_stream_frame:
            on_stream_frame(conn, f)
    t0 = time.perf_counter()
    conn = await connect_raw(port, on_frame, name)
    session = {} if resume is None else {"token": resume[0], "position": resume[1]}
    conn.send(frame(HELLO, 0x7FFFFFFF, "", hello_payload(session=session)))
    kind, answer, t1 = await asyncio.wait_for(welcome, 10)
    if kind != WELCOME or "session" not in answer:
        raise RuntimeError(f"{name}: no session: {answer}")
    return conn, answer, t1 - t0


class Raw(FrameConnection):
    """A FrameConnection that hands every frame to on_frame (no request matching, no PONG on its own)."""

    def data_received(self, data):
        for f in self.parser.feed(data):
            self.on_frame_cb(self, f)


async def connect_raw(port, on_frame, name):
    _, proto = await asyncio.get_running_loop().create_connection(lambda: Raw(on_frame, name), "127.0.0.1", port)
    return proto


async def reconnects(port):
    """Figures of `reconnect`; returns (rows, failures)."""
    failures = []
    state = {"received": 0, "last": None, "events": 0, "first": None, "disorder": 0, "gaps": 0}

    def on_stream(conn, f):
        state["received"] += size_of(f)
        if f[0] == MESSAGE and f[2] == 0 and f[4]:
            seq = sequence(f[4])
            if state["first"] is None:
                state["first"] = time.perf_counter()
            if state["last"] is not None and seq != state["last"] + 1:
                state["disorder" if seq <= state["last"] else "gaps"] += 1
            state["last"] = seq
            state["events"] += 1

    async def open_listener(resume=None):
        welcome = asyncio.get_running_loop().create_future()

        def on_frame(conn, f):
            if not welcome.done():
                if f[0] in (WELCOME, ERROR):
                    welcome.set_result((f[0], json_of(f[4]), time.perf_counter()))
                return
            if f[0] != POSITION:
                on_stream(conn, f)
        t0 = time.perf_counter()
        conn = await connect_raw(port, on_frame, "listener")
        session = {} if resume is None else {"token": resume, "position": state["received"]}
        conn.send(frame(HELLO, 1, "", hello_payload(session=session)))
        if resume is None:
            conn.send(frame(MESSAGE, 1, ROOM, method_call("listen", None)))
        kind, answer, t1 = await asyncio.wait_for(welcome, 10)
        if kind != WELCOME or "session" not in answer:
            raise RuntimeError(f"no session: {answer}")
        return conn, answer["session"], t0, t1

    listener, session, _, _ = await open_listener()
    token = session["token"]
    poster = await connect(port, name="poster")
    stop = asyncio.Event()

    async def post():
        n = 0
        while not stop.is_set():
            n += 1
            await poster.call(ROOM_POST, struct.pack(">Q", n) + bytes(EVENT_SIZE - 8))
            await asyncio.sleep(POST_INTERVAL)
    posting = asyncio.create_task(post())
    to_welcome, to_event = [], []
    for _ in range(RECONNECTS):
        await asyncio.sleep(0.05)
        listener.abort()
        await asyncio.sleep(CUT_GAP)
        state["first"] = None
        listener, session, t0, t1 = await open_listener(token)
        if not session.get("resumed"):
            failures.append(f"a reconnect did not resume: {session}")
            break
        deadline = time.monotonic() + 5
        while state["first"] is None and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        if state["first"] is None:
            failures.append("no replayed event within 5 s")
            break
        to_welcome.append((t1 - t0) * 1000)
        to_event.append((state["first"] - t0) * 1000)
    stop.set()
    await posting
    await asyncio.sleep(0.2)
    listener.send(frame(END))
    listener.close()
    poster.close()
    if state["gaps"] or state["disorder"]:
        failures.append(f"across the reconnects: {state['gaps']} gaps, {state['disorder']} events out of order or twice")
    row = lambda name, values: (f"| {name} | {percentile(values, 50):.2f} | {percentile(values, 90):.2f} | "
                                f"{percentile(values, 99):.2f} | {max(values):.2f} |")
    rows = [f"{len(to_event)} reconnects of a room listener, each {CUT_GAP * 1000:.0f} ms after its reset, with an event "
            f"posted every {POST_INTERVAL * 1000:.0f} ms ({state['events']} events in all, none lost or twice):", "",
            "| from the start of the new connection to | p50 ms | p90 ms | p99 ms | max ms |", "|---|---|---|---|---|",
            row("the WELCOME (resumed)", to_welcome), row("the first replayed event", to_event)]
    return rows, failures


async def acks(port, events, rate):
    """One session listener and one session poster, `events` posts; returns the POSITION bytes
    ((listener out, listener in), (poster out, poster in)) and failures."""
    failures = []
    seen = {"last": 0, "bad": 0, "count": 0}
    listener_ack = None

    def on_listener(conn, f):
        if not listener_ack.frame(f):
            return
        if f[0] == MESSAGE and f[2] == 0 and f[4]:
            seq = sequence(f[4])
            if seq != seen["last"] + 1:
                seen["bad"] += 1
            seen["last"] = seq
            seen["count"] += 1
    listener, welcome, _ = await session_connection(port, "listener", on_listener)
    listener_ack = Acknowledging(listener, welcome)
    listener.send(frame(MESSAGE, 1, ROOM, method_call("listen", None)))
    answered = {"n": 0}
    window = asyncio.Semaphore(FAST_WINDOW)
    poster_ack = None

    def on_poster(conn, f):
        if not poster_ack.frame(f):
            return
        if f[0] == REPLY:
            answered["n"] += 1
            window.release()
    poster, welcome, _ = await session_connection(port, "poster", on_poster)
    poster_ack = Acknowledging(poster, welcome)
    await asyncio.sleep(0.2)  # the listen is in place
    body = bytes(EVENT_SIZE - 8)
    t0 = time.monotonic()
    for n in range(1, events + 1):
        await window.acquire()
        poster.send(frame(MESSAGE, n, ROOM_POST, struct.pack(">Q", n) + body))
        if rate:
            await asyncio.sleep(max(0, t0 + n / rate - time.monotonic()))
    deadline = time.monotonic() + 30
    while (seen["count"] < events or answered["n"] < events) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(2.5)  # the last acknowledgements by time, both ways
    if seen["count"] != events or seen["bad"]:
        failures.append(f"acks: {seen['count']} of {events} events, {seen['bad']} out of sequence")
    for conn in (listener, poster):
        conn.send(frame(END))
        conn.close()
    return ((listener_ack.sent_bytes, listener_ack.received_bytes), (poster_ack.sent_bytes, poster_ack.received_bytes)), failures


async def main_async(args):
    failures = []
    rows, f = await reconnects(args.port)
    failures += f
    rows += ["", f"POSITION bytes per 1,000 events of {EVENT_SIZE} B (a room event is {12 + len(ROOM) + 3 + EVENT_SIZE} B on the "
             f"wire, a post {12 + len(ROOM_POST) + EVENT_SIZE} B and its REPLY 12 B), each way:", "",
             "| rate | listener → server | server → listener | poster → server | server → poster |",
             "|---|---|---|---|---|"]
    for name, events, rate in ((f"as fast as a window of {FAST_WINDOW} goes ({FAST_EVENTS:,} events)", FAST_EVENTS, None),
                               (f"{SLOW_RATE} events/s ({SLOW_EVENTS:,} events)", SLOW_EVENTS, SLOW_RATE)):
        ((lo, li), (po, pi)), f = await acks(args.port, events, rate)
        failures += f
        per = lambda b: f"{b * 1000 / events:.1f}"
        rows.append(f"| {name} | {per(lo)} | {per(li)} | {per(po)} | {per(pi)} |")
    print("\n".join(rows))
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    sys.exit(asyncio.run(main_async(p.parse_args())))


if __name__ == "__main__":
    main()
