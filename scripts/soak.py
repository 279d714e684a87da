#!/usr/bin/env python3
"""Soak test for a running Switchboard server (started by scripts/soak): every workload at once for MINUTES.

Workloads (all binary frames unless said):
  rpc      RPC_CONNS connections pipelining `echo` calls on switchboard/echo (window RPC_DEPTH, paced);
           every reply must be the success envelope of exactly the arguments sent.
  room     ROOM_LISTENERS listeners on switchboard/room, joined before the first post; one poster posts
           a sequence number (+ filler) to switchboard/room.post at ROOM_RATE per second.
  held     one client REGISTERs soak/held (message channel, BinaryCodec) and echoes every forwarded
           MESSAGE; HELD_CALLERS clients call it (a few CANCEL right after sending).
  churn    CHURN_WORKERS loops: connect, one call (binary or JSON line), close; some abort with a
           request pending, some abort in the middle of a frame.
  slow     SLOW_READERS room listeners with a 4 KiB receive buffer that read a few hundred bytes per
           second; when the server closes one (slow_consumer), a new one takes its place.

Pass/fail (exit 1 with the reasons listed):
  * every request with id != 0 on a connection we did not abort gets exactly one answer (REPLY or ERROR
    with its id): none left pending after a 20 s drain, none duplicated or unmatched;
  * every answer is right (echo bytes, room.post null reply, REGISTER null reply);
  * events: each room listener gets its events in order without duplicates, and the events missing
    (the healthy listeners' posted - delivered, plus the gaps inside each slow reader's stream) are
    no more than the server's eventsDropped (all reasons) from switchboard/stats;
  * RSS: sampled every 10 s under load. The first third of the samples is warm-up; FAIL when the mean
    of the last third exceeds the mean of the middle third by more than 10 % AND more than 8 MiB
    (both, so that neither small absolute noise nor allocator jitter on a small heap fails it). Runs
    with fewer than 6 samples skip this check (said in the output);
  * after every client is gone, stats show 1 connection (ours), 0 repliesPending, 0 registrations.

With --cuts FRACTION (scripts/soak --cuts, which starts the server with --session-ttl CUT_TTL_MS) the workloads
are resumable sessions of the Python client (clients/python, `resumable=True`), each through a cutting proxy
of its own (switchboard.cutting_proxy), and every second each proxy is cut (a reset both ways, at whatever
byte the streams are at) with probability FRACTION; one cut in CUT_RESTART_ONE_IN keeps its client away
until CUT_HOLD_PAST_TTL s past the time to live, so that its session cannot be resumed (the client falls
back: `restarted`, or `ended` if it gave up). CUT_RPC clients pipeline `echo` calls (window CUT_RPC_DEPTH,
CUT_RPC_RATE a second each), a poster posts numbered events at CUT_POST_RATE a second, CUT_LISTENERS
listen to the room. Pass/fail, exactly:
  * every call and post is answered exactly once with the right answer, or fails with SessionLostError;
    each client's SessionLostErrors are exactly the failed requests its `restarted`/`ended` events report;
  * each listener gets each event at most once and in order; every gap in its events is either posts
    that failed with SessionLostError (which may or may not have run) or follows a restart the client
    reported, at most one gap per restart; and it gets every event to the last;
  * the final stats, as above, and no session left parked once the clients have ended theirs.
"""
import argparse
import asyncio
import json
import os
import random
import struct
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python", "src"))
from sbwire import (CANCEL, ECHO, ERROR, MESSAGE, NULL_PAYLOAD, PING, REGISTER, REPLY, ROOM, ROOM_POST,
                    TYPE_NAMES, Int64, connect, error_code, frame, get_stats, method_call, mib,
                    rss_kib, success, total_dropped, FrameParser)

RPC_CONNS, RPC_DEPTH, RPC_RATE = 4, 8, 250  # per connection: calls/s
ROOM_LISTENERS, ROOM_RATE, POST_SIZE = 50, 100, 256
HELD, HELD_CALLERS, HELD_RATE, HELD_DEPTH, CANCEL_SHARE = "soak/held", 2, 150, 16, 0.02
CHURN_WORKERS, CHURN_PAUSE = 3, 0.03
SLOW_READERS = [(256, 0.25), (512, 0.5), (256, 1.0)]  # (bytes per read, seconds between reads)
RSS_PERIOD = 10.0
DRAIN_TIMEOUT = 20.0
ANSWER_TIMEOUT = 20.0
CUT_RPC, CUT_RPC_DEPTH, CUT_RPC_RATE = 4, 8, 100
CUT_LISTENERS, CUT_POST_RATE = 10, 50
CUT_RESTART_ONE_IN, CUT_TTL_MS, CUT_HOLD_PAST_TTL = 10, 3000, 0.7  # scripts/soak --cuts: --session-ttl CUT_TTL_MS
CUT_CONNECT_TIMEOUT = 2.0  # each try of a client to connect again
switchboard = CuttingProxy = None  # clients/python, imported in the cut mode only


class Soak:
    def __init__(self, port, pid, seconds, cuts=None):
        self.port, self.pid, self.seconds, self.cuts = port, pid, seconds, cuts
        self.cut_clients, self.cut_listeners, self.cut_posts_lost = [], [], set()
        self.loop = asyncio.get_running_loop()
        self.stop = False
        self.failures = []
        self.c = {k: 0 for k in (
            "rpc_sent", "rpc_answers", "held_sent", "held_answers", "held_cancels", "held_cancelled_answers",
            "holder_requests", "holder_cancels", "posts", "post_answers", "churn", "churn_calls",
            "churn_answers", "churn_abort_pending", "churn_abort_midframe", "churn_text",
            "slow_joined", "slow_closed_slow_consumer", "slow_closed_reset", "slow_closed_other", "slow_events", "slow_gaps",
            "cut_rpc_sent", "cut_rpc_answers", "cut_rpc_lost", "cut_posts", "cut_post_answers", "cuts", "cut_held")}
        self.conns = []  # connections whose requests must all be answered
        self.listeners = []
        self.rss = []  # (elapsed s, KiB)
        self.rss_baseline = None
        self.rss_after = None
        self.bad = {}  # kind of wrong answer -> count (first example kept in failures)

    def fail(self, msg):
        if len(self.failures) < 50:
            self.failures.append(msg)

    def wrong(self, kind, detail):
        self.bad[kind] = self.bad.get(kind, 0) + 1
        if self.bad[kind] == 1:
            self.fail(f"{kind}: {detail}")

    async def tracked(self, name, on_frame=None, **kw):
        conn = await connect(self.port, on_frame=on_frame, name=name, **kw)
        self.conns.append(conn)
        return conn

    async def pace(self, next_t, interval):
        next_t += interval
        delay = next_t - self.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -1.0:  # fell behind by more than a second: do not burst to catch up
            next_t = self.loop.time()
        return next_t

    # ---- rpc
    def rpc_args(self, rng, idx, seq):
        shape = seq % 4
        if shape == 0:
            return {"conn": idx, "seq": seq, "s": "soak-%d" % rng.randrange(10**6)}
        if shape == 1:
            return [seq, -seq, Int64(seq), seq * 0.25, None, True, False]
        if shape == 2:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        return {"nested": [{"k": "v" * rng.randrange(1, 20)}, [1.5, "héllo"]], "seq": Int64(seq)}

    async def rpc_worker(self, idx):
        conn = await self.tracked(f"rpc{idx}")
        rng = random.Random(idx)
        window = asyncio.Semaphore(RPC_DEPTH)
        next_t, seq = self.loop.time(), 0
        while not self.stop:
            await window.acquire()
            if self.stop:
                break
            args = self.rpc_args(rng, idx, seq)
            seq += 1
            _, fut = conn.request(MESSAGE, ECHO, method_call("echo", args))
            self.c["rpc_sent"] += 1
            expected = success(args)

            def done(f, expected=expected):
                window.release()
                if f.cancelled() or f.exception():
                    return
                self.c["rpc_answers"] += 1
                kind, payload = f.result()
                if kind != REPLY or payload != expected:
                    self.wrong("rpc wrong answer", f"{TYPE_NAMES.get(kind)} {payload!r:.80} != {expected!r:.80}")
            fut.add_done_callback(done)
            next_t = await self.pace(next_t, 1.0 / RPC_RATE)

    # ---- room
    def make_listener(self, idx):
        state = {"idx": idx, "delivered": 0, "last": 0, "first": None, "disorder": 0, "ended": False,
                 "error_events": 0}

        def on_frame(conn, f):
            kind, flags, fid, ch, payload = f
            if kind != MESSAGE or fid != 0 or ch != ROOM:
                return
            if payload is None:
                state["ended"] = True
                return
            if payload[0] != 0:
                state["error_events"] += 1
                return
            seq = struct.unpack_from(">Q", payload, 3 if payload[2] < 254 else 5)[0]
            if state["first"] is None:
                state["first"] = seq
            if seq <= state["last"]:
                state["disorder"] += 1
            state["last"] = max(state["last"], seq)
            state["delivered"] += 1
        return state, on_frame

    async def room_listener(self, idx):
        state, on_frame = self.make_listener(idx)
        conn = await self.tracked(f"listener{idx}", on_frame)
        kind, payload = await asyncio.wait_for(conn.call(ROOM, method_call("listen", None)), ANSWER_TIMEOUT)
        if kind != REPLY or payload != success(None):
            self.fail(f"listener{idx}: listen answered {TYPE_NAMES.get(kind)} {payload!r}")
        state["conn"] = conn
        self.listeners.append(state)

    async def poster(self):
        conn = await self.tracked("poster")
        window = asyncio.Semaphore(256)
        next_t, seq = self.loop.time(), 0
        filler = bytes(range(256)) * (POST_SIZE // 256 + 1)
        while not self.stop:
            await window.acquire()
            seq += 1
            _, fut = conn.request(MESSAGE, ROOM_POST, struct.pack(">Q", seq) + filler[:POST_SIZE - 8])
            self.c["posts"] = seq

            def done(f):
                window.release()
                if f.cancelled() or f.exception():
                    return
                self.c["post_answers"] += 1
                kind, payload = f.result()
                if kind != REPLY or payload is not None:
                    self.wrong("room.post wrong answer", f"{TYPE_NAMES.get(kind)} {payload!r:.80}")
            fut.add_done_callback(done)
            next_t = await self.pace(next_t, 1.0 / ROOM_RATE)

    # ---- slow readers: raw sockets, a tiny receive buffer, a few hundred bytes read per period
    async def slow_reader(self, idx, chunk, period):
        """Listens with a 4 KiB receive buffer and reads `chunk` bytes every `period` s. A PING every 2 s
        finds out when the server has closed the connection (the ERROR slow_consumer would wait behind
        megabytes of buffered events): the next write then fails. Then a new slow reader joins."""
        import socket
        while not self.stop:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await self.loop.sock_connect(sock, ("127.0.0.1", self.port))
            await self.loop.sock_sendall(sock, frame(MESSAGE, 1, ROOM, method_call("listen", None)))
            self.c["slow_joined"] += 1
            parser, last, closed_by, last_ping = FrameParser(), None, None, self.loop.time()
            try:
                while not self.stop and closed_by is None:
                    if self.loop.time() - last_ping >= 2.0:
                        last_ping = self.loop.time()
                        try:
                            sock.send(frame(PING, 0))
                        except BlockingIOError:
                            pass
                    try:
                        data = await asyncio.wait_for(self.loop.sock_recv(sock, chunk), period + 1.0)
                    except asyncio.TimeoutError:
                        continue
                    if not data:
                        closed_by = "eof"
                        break
                    for kind, flags, fid, ch, payload in parser.feed(data):
                        if kind == ERROR:
                            closed_by = error_code(payload)
                        elif kind == MESSAGE and fid == 0 and payload and payload[0] == 0:
                            seq = struct.unpack_from(">Q", payload, 3 if payload[2] < 254 else 5)[0]
                            self.c["slow_events"] += 1
                            if last is not None:
                                if seq <= last:
                                    self.fail(f"slow reader {idx}: event {seq} after {last} (disorder/duplicate)")
                                self.c["slow_gaps"] += max(0, seq - last - 1)
                            last = seq
                    await asyncio.sleep(period)
            except ConnectionError:
                closed_by = "reset"
            finally:
                sock.close()
            if closed_by == "slow_consumer":
                self.c["slow_closed_slow_consumer"] += 1
            elif closed_by == "reset":
                self.c["slow_closed_reset"] += 1
            elif closed_by is not None:
                self.c["slow_closed_other"] += 1
                self.fail(f"slow reader {idx}: closed by the server with {closed_by!r}, not slow_consumer")

    # ---- client-held channel
    async def holder(self):
        def on_frame(conn, f):
            kind, flags, fid, ch, payload = f
            if kind == MESSAGE and fid != 0:
                self.c["holder_requests"] += 1
                conn.send(frame(REPLY, fid, "", payload))
            elif kind == CANCEL:
                self.c["holder_cancels"] += 1
        conn = await self.tracked("holder", on_frame)
        decl = json.dumps({"kind": "message", "codec": "binary"}).encode()
        kind, payload = await asyncio.wait_for(conn.call(HELD, decl, kind=REGISTER), ANSWER_TIMEOUT)
        if kind != REPLY or payload is not None:
            raise RuntimeError(f"REGISTER {HELD} answered {TYPE_NAMES.get(kind)} {payload!r}")
        return conn

    async def held_caller(self, idx):
        conn = await self.tracked(f"held-caller{idx}")
        rng = random.Random(1000 + idx)
        window = asyncio.Semaphore(HELD_DEPTH)
        next_t = self.loop.time()
        while not self.stop:
            await window.acquire()
            if self.stop:
                break
            n = rng.randrange(-1, 200)
            msg = None if n < 0 else bytes(rng.randrange(256) for _ in range(n))
            fid, fut = conn.request(MESSAGE, HELD, msg)
            self.c["held_sent"] += 1
            cancelled = rng.random() < CANCEL_SHARE
            if cancelled:
                conn.send(frame(CANCEL, fid))
                self.c["held_cancels"] += 1

            def done(f, msg=msg, cancelled=cancelled):
                window.release()
                if f.cancelled() or f.exception():
                    return
                self.c["held_answers"] += 1
                kind, payload = f.result()
                if kind == REPLY and payload == msg:
                    return
                if cancelled and kind == ERROR and error_code(payload) == "cancelled":
                    self.c["held_cancelled_answers"] += 1
                    return
                self.wrong("held wrong answer", f"{TYPE_NAMES.get(kind)} {payload!r:.80} for {msg!r:.40}"
                           f" (cancelled={cancelled})")
            fut.add_done_callback(done)
            next_t = await self.pace(next_t, 1.0 / HELD_RATE)

    # ---- churn
    async def churn_worker(self, idx):
        rng = random.Random(2000 + idx)
        while not self.stop:
            mode = rng.random()
            self.c["churn"] += 1
            try:
                if mode < 0.15:  # JSON lines
                    n = self.c["churn"]
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                    writer.write(b'{"id":%d,"call":"switchboard/echo","method":"echo","args":[%d,"churn"]}\n' % (n, n))
                    self.c["churn_text"] += 1
                    self.c["churn_calls"] += 1
                    try:
                        line = await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT)
                    except asyncio.TimeoutError:
                        line = None
                    if not line:
                        self.fail("churn: a JSON-lines call got no answer (lost answer)")
                        self.c["churn_lost"] = self.c.get("churn_lost", 0) + 1
                    else:
                        self.c["churn_answers"] += 1
                        answer = json.loads(line)
                        if answer != {"id": n, "result": [n, "churn"]}:
                            self.wrong("churn text wrong answer", repr(answer))
                    writer.close()
                    await asyncio.sleep(CHURN_PAUSE)
                    continue
                conn = await connect(self.port, name=f"churn{idx}")
                args = ["churn", idx, self.c["churn"]]
                call = frame(MESSAGE, 1, ECHO, method_call("echo", args))
                if mode < 0.25:  # a request pending, then RST
                    conn.send(call)
                    self.c["churn_abort_pending"] += 1
                    conn.abort()
                elif mode < 0.40:  # part of a frame, then RST or FIN
                    conn.send(call[:rng.randrange(1, len(call))])
                    self.c["churn_abort_midframe"] += 1
                    conn.abort() if rng.random() < 0.5 else conn.close()
                else:
                    self.c["churn_calls"] += 1
                    try:
                        kind, payload = await asyncio.wait_for(conn.call(ECHO, method_call("echo", args)),
                                                               ANSWER_TIMEOUT)
                    except asyncio.TimeoutError:
                        self.fail(f"churn: no answer within {ANSWER_TIMEOUT} s (lost answer)")
                        self.c["churn_lost"] = self.c.get("churn_lost", 0) + 1
                    else:
                        self.c["churn_answers"] += 1
                        if kind != REPLY or payload != success(args):
                            self.wrong("churn wrong answer", f"{TYPE_NAMES.get(kind)} {payload!r:.80}")
                    await asyncio.sleep(0)
                    if conn.unexpected:
                        self.wrong("churn duplicate answer", repr(conn.unexpected[:3]))
                    conn.close()
            except (ConnectionError, OSError) as e:
                self.fail(f"churn: {type(e).__name__}: {e}")
            await asyncio.sleep(CHURN_PAUSE)

    # ---- cuts (--cuts): resumable sessions through cutting proxies, a fraction of them cut every second
    async def cut_client(self, name):
        """A resumable client (clients/python) of its own cutting proxy; its session events are recorded."""
        proxy = await CuttingProxy("127.0.0.1", self.port, seed=len(self.cut_clients)).start()
        entry = {"name": name, "proxy": proxy, "events": [], "client": None, "inflight": set()}

        def on_session_event(event):
            entry["events"].append(event)
            if event.kind != "resumed":
                entry.setdefault("restart_times", []).append(self.loop.time())
        entry["client"] = await switchboard.connect(proxy.host, proxy.port, resumable=True, timeout=CUT_CONNECT_TIMEOUT,
                                                    on_session_event=on_session_event)
        if entry["client"].session is None:
            raise RuntimeError(f"{name}: the server granted no session")
        self.cut_clients.append(entry)
        return entry

    def lost_reported(self, entry):
        """Requests of `entry` that its session events name as failed (SessionLostError)."""
        return sum(len(e.failed) for e in entry["events"] if e.kind in ("restarted", "ended"))

    async def cut_request(self, entry, channel, payload, on_answer):
        """One request on a resumable client: on_answer(payload) for its answer, or counts it lost when it
        fails with SessionLostError (the session was not resumed); anything else fails the soak."""
        try:
            frame_ = await entry["client"].request(MESSAGE, channel, payload)
        except switchboard.SessionLostError:
            entry["lost"] = entry.get("lost", 0) + 1
            return False
        except Exception as e:  # an answer lost to a cut, or an error answer: never right here
            self.wrong("session request failed", f"{entry['name']}: {type(e).__name__}: {e}")
            return None
        on_answer(frame_.payload)
        return True

    async def cut_rpc_worker(self, idx):
        entry = await self.cut_client(f"session-rpc{idx}")
        rng = random.Random(100 + idx)
        window = asyncio.Semaphore(CUT_RPC_DEPTH)
        next_t, seq, inflight = self.loop.time(), 0, entry["inflight"]

        async def one(args):
            expected = success(args)

            def check(payload):
                self.c["cut_rpc_answers"] += 1
                if payload != expected:
                    self.wrong("session rpc wrong answer", f"{payload!r:.80} != {expected!r:.80}")
            if await self.cut_request(entry, ECHO, method_call("echo", args), check) is False:
                self.c["cut_rpc_lost"] += 1
            window.release()
        while not self.stop:
            await window.acquire()
            args = self.rpc_args(rng, idx, seq)
            seq += 1
            self.c["cut_rpc_sent"] += 1
            task = asyncio.create_task(one(args))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            next_t = await self.pace(next_t, 1.0 / CUT_RPC_RATE)
        await asyncio.gather(*inflight)

    async def cut_poster(self):
        entry = await self.cut_client("session-poster")
        window = asyncio.Semaphore(32)
        next_t, inflight = self.loop.time(), entry["inflight"]
        filler = bytes(range(256)) * (POST_SIZE // 256 + 1)

        async def one(seq):
            def check(payload):
                self.c["cut_post_answers"] += 1
                if payload is not None:
                    self.wrong("session room.post wrong answer", f"{payload!r:.80}")
            if await self.cut_request(entry, ROOM_POST, struct.pack(">Q", seq) + filler[:POST_SIZE - 8], check) is False:
                self.cut_posts_lost.add(seq)  # may or may not have been posted: a listener may miss it
            window.release()
        while not self.stop:
            await window.acquire()
            self.c["cut_posts"] += 1
            task = asyncio.create_task(one(self.c["cut_posts"]))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            next_t = await self.pace(next_t, 1.0 / CUT_POST_RATE)
        await asyncio.gather(*inflight)

    async def cut_listener(self, idx, ready):
        entry = await self.cut_client(f"session-listener{idx}")
        state = {"entry": entry, "last": 0, "delivered": 0, "gaps": [], "disorder": 0}
        self.cut_listeners.append(state)
        stream = switchboard.EventChannel(ROOM, entry["client"]).receive_broadcast_stream()
        await stream.listen()
        ready()
        try:
            async for value in stream:
                seq = struct.unpack_from(">Q", value)[0]
                if seq <= state["last"]:
                    state["disorder"] += 1
                    self.fail(f"session-listener{idx}: event {seq} after {state['last']} (duplicate or out of order)")
                elif seq > state["last"] + 1:
                    state["gaps"].append((state["last"] + 1, seq, self.loop.time()))  # judged at the end
                state["last"] = max(state["last"], seq)
                state["last_at"] = self.loop.time()
                state["delivered"] += 1
        except Exception as e:  # the stream must go on across every cut
            if not self.stop:
                self.fail(f"session-listener{idx}: the stream ended: {type(e).__name__}: {e}")

    async def cutter(self):
        """Every second, cuts each proxy with probability `cuts`; one cut in CUT_RESTART_ONE_IN keeps the
        client away past the server's time to live first, so that its session cannot be resumed."""
        rng = random.Random(7)
        while not self.stop:
            await asyncio.sleep(1)
            for entry in self.cut_clients:
                proxy = entry["proxy"]
                if entry.get("held") or rng.random() >= self.cuts:
                    continue
                if rng.randrange(CUT_RESTART_ONE_IN) == 0:
                    entry["held"] = True
                    proxy.hold()
                    self.c["cut_held"] += 1

                    def release(entry=entry):
                        entry["proxy"].release()
                        entry["held"] = False
                    self.loop.call_later(CUT_TTL_MS / 1000 + CUT_HOLD_PAST_TTL, release)
                self.c["cuts"] += proxy.cut()

    def check_cuts(self):
        """Exact accounting of the resumable clients; returns the figures."""
        kinds = {}
        for entry in self.cut_clients:
            for e in entry["events"]:
                key = e.kind if e.kind == "resumed" else f"{e.kind} ({e.reason})"
                kinds[key] = kinds.get(key, 0) + 1
            lost, reported = entry.get("lost", 0), self.lost_reported(entry)
            if lost != reported:
                self.fail(f"{entry['name']}: {lost} request(s) failed with session_lost, its session events report {reported}")
            if entry["client"].is_open is False and not any(e.kind == "ended" for e in entry["events"]):
                self.fail(f"{entry['name']}: the client closed without an ended report")
        answered = self.c["cut_rpc_answers"] + self.c["cut_rpc_lost"] + self.c["cut_post_answers"] + len(self.cut_posts_lost)
        if answered + self.bad.get("session request failed", 0) != self.c["cut_rpc_sent"] + self.c["cut_posts"]:
            self.fail(f"{answered} request(s) answered or lost of {self.c['cut_rpc_sent'] + self.c['cut_posts']} sent")
        posted = self.c["cut_posts"]
        missing_reported = 0
        for state in self.cut_listeners:
            entry = state["entry"]
            # Each gap (the tail too) that is not posts lost must follow a restart of this client, reported
            # near it (from CUT_TTL_MS + 5 s before to 5 s after): one restart explains one gap.
            gaps = list(state["gaps"]) + [(state["last"] + 1, posted + 1, state.get("last_at", 0) + CUT_TTL_MS / 1000 + 5)]
            restarts = sorted(entry.get("restart_times", []))
            for low, high, seen_at in gaps:
                missing = sum(1 for s in range(low, high) if s not in self.cut_posts_lost)
                if not missing:
                    continue
                match = next((t for t in restarts if seen_at - CUT_TTL_MS / 1000 - 5 <= t <= seen_at + 5), None)
                if match is None:
                    self.fail(f"{entry['name']}: {missing} event(s) from {low} to {high - 1} lost without a restart reported")
                else:
                    restarts.remove(match)
                    missing_reported += missing
        return kinds, missing_reported

    async def cut_run(self):
        """The tasks of the cut mode, once every listener listens."""
        waiting = asyncio.Event()
        ready_count = [0]

        def ready():
            ready_count[0] += 1
            if ready_count[0] == CUT_LISTENERS:
                waiting.set()
        listeners = [asyncio.create_task(self.cut_listener(i, ready)) for i in range(CUT_LISTENERS)]
        await asyncio.wait_for(waiting.wait(), 30)
        return listeners, [self.cut_rpc_worker(i) for i in range(CUT_RPC)] + [self.cut_poster(), self.cutter()]

    # ---- RSS
    async def rss_sampler(self, start):
        while not self.stop:
            self.rss.append((self.loop.time() - start, rss_kib(self.pid)))
            try:
                await asyncio.wait_for(self.stop_event.wait(), RSS_PERIOD)
            except asyncio.TimeoutError:
                pass

    async def run(self):
        self.stop_event = asyncio.Event()
        self.rss_baseline = rss_kib(self.pid)
        stats0 = await get_stats(self.port)
        if self.cuts is not None:
            holder = None
            streams, work = await self.cut_run()
            print(f"soak: {self.seconds / 60:.1f} min on port {self.port}, cutting {self.cuts:.0%} of the connections every "
                  f"second: {CUT_RPC} rpc sessions, {CUT_LISTENERS} listening sessions + a posting session at "
                  f"{CUT_POST_RATE}/s, each through a cutting proxy", flush=True)
        else:
            holder = await self.holder()
            await asyncio.gather(*(self.room_listener(i) for i in range(ROOM_LISTENERS)))
            print(f"soak: {self.seconds / 60:.1f} min on port {self.port}: {RPC_CONNS} rpc, {ROOM_LISTENERS} listeners "
                  f"+ poster at {ROOM_RATE}/s, held channel with {HELD_CALLERS} callers, {CHURN_WORKERS} churn loops, "
                  f"{len(SLOW_READERS)} slow readers", flush=True)
            work = ([self.rpc_worker(i) for i in range(RPC_CONNS)] + [self.poster()]
                    + [self.held_caller(i) for i in range(HELD_CALLERS)]
                    + [self.churn_worker(i) for i in range(CHURN_WORKERS)]
                    + [self.slow_reader(i, c, p) for i, (c, p) in enumerate(SLOW_READERS)])
        start = self.loop.time()
        tasks = [asyncio.create_task(t) for t in work]
        sampler = asyncio.create_task(self.rss_sampler(start))
        last_report = start
        while self.loop.time() - start < self.seconds:
            await asyncio.sleep(1)
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()
            if self.loop.time() - last_report >= 30 and self.cuts is not None:
                last_report = self.loop.time()
                print(f"  {last_report - start:5.0f} s: session rpc {self.c['cut_rpc_answers']} (+{self.c['cut_rpc_lost']} lost), "
                      f"posts {self.c['cut_posts']}, cuts {self.c['cuts']}, RSS {mib(self.rss[-1][1]):.1f} MiB", flush=True)
            elif self.loop.time() - last_report >= 30:
                last_report = self.loop.time()
                print(f"  {last_report - start:5.0f} s: rpc {self.c['rpc_answers']}, posts {self.c['posts']}, "
                      f"held {self.c['held_answers']}, churn {self.c['churn']}, "
                      f"RSS {mib(self.rss[-1][1]):.1f} MiB", flush=True)
        self.stop = True
        self.stop_event.set()
        await sampler
        # Drain: every request still pending gets DRAIN_TIMEOUT seconds to be answered.
        drain_end = self.loop.time() + DRAIN_TIMEOUT
        await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT)
        while self.loop.time() < drain_end and any(c.pending for c in self.conns):
            await asyncio.sleep(0.1)
        for entry in self.cut_clients:
            waiting = sum(1 for t in entry["inflight"] if not t.done())
            if waiting:
                self.fail(f"{entry['name']}: {waiting} request(s) unanswered {DRAIN_TIMEOUT:.0f} s after the end (session "
                          f"events: {[(e.kind, e.reason) for e in entry['events']][-3:]})")
        for t in tasks:
            if not t.done():
                t.cancel()
        if self.cuts is not None:  # the session listeners catch up (a held client comes back first)
            deadline = self.loop.time() + CUT_TTL_MS / 1000 + 20
            while self.loop.time() < deadline and any(s["last"] < self.c["cut_posts"] for s in self.cut_listeners):
                await asyncio.sleep(0.2)
            stats = await get_stats(self.port)
            return stats0, stats, holder
        # Listeners catch up with the last post (stop once nothing moves for 5 s).
        posted, idle_since = self.c["posts"], self.loop.time()
        progress = -1
        while self.loop.time() - idle_since < 5:
            now_total = sum(s["delivered"] for s in self.listeners)
            if all(s["last"] >= posted for s in self.listeners):
                break
            if now_total != progress:
                progress, idle_since = now_total, self.loop.time()
            await asyncio.sleep(0.2)
        stats = await get_stats(self.port)
        return stats0, stats, holder

    def check(self, stats0, stats):
        lost = sum(len(c.pending) for c in self.conns)
        unexpected = sum(len(c.unexpected) for c in self.conns)
        lost += self.c.get("churn_lost", 0)
        if lost:
            names = sorted({c.name for c in self.conns if c.pending})
            self.fail(f"{lost} request(s) never answered (on {', '.join(names[:8]) or 'churn'})")
        if unexpected:
            ex = next(c for c in self.conns if c.unexpected)
            self.fail(f"{unexpected} duplicate or unmatched answer(s), e.g. on {ex.name}: "
                      f"{[(TYPE_NAMES.get(k), i) for k, i, _ in ex.unexpected[:3]]}")
        closed_conns = [c.name for c in self.conns if c.closed.done()]
        if closed_conns:
            self.fail(f"the server closed connection(s) it should have kept: {closed_conns[:8]}")
        for c in self.conns:
            if c.errors:
                self.fail(f"{c.name}: ERROR frame(s) with id 0: {c.errors[:3]}")
        posted = self.c["posts"]
        healthy_missing = 0
        for s in self.listeners:
            if s["disorder"]:
                self.fail(f"listener{s['idx']}: {s['disorder']} event(s) out of order or duplicated")
            if s["ended"] or s["error_events"]:
                self.fail(f"listener{s['idx']}: stream ended={s['ended']} error events={s['error_events']}")
            healthy_missing += posted - s["delivered"]
        dropped = total_dropped(stats) - total_dropped(stats0)
        missing = healthy_missing + self.c["slow_gaps"]
        if missing > dropped:
            self.fail(f"events lost without being counted: {missing} missing "
                      f"({healthy_missing} at healthy listeners, {self.c['slow_gaps']} inside slow readers' "
                      f"streams) but eventsDropped grew by {dropped}")
        slow_closed = stats.get("slowConsumersClosed", 0) - stats0.get("slowConsumersClosed", 0)
        seen = self.c["slow_closed_slow_consumer"] + self.c["slow_closed_reset"]
        if seen > slow_closed:
            self.fail(f"{seen} slow readers closed by the server, but stats count {slow_closed} slow consumers closed")
        return dict(posted=posted, healthy_missing=healthy_missing, dropped=dropped, slow_closed=slow_closed,
                    lost=lost, unexpected=unexpected)

    def check_rss(self):
        samples = [k for _, k in self.rss]
        n = len(samples)
        third = n // 3
        phases = []
        if n:
            bounds = [("warm-up", 0, third), ("middle", third, 2 * third), ("last", 2 * third, n)]
            for name, a, b in bounds:
                part = samples[a:b]
                if part:
                    phases.append((name, len(part), min(part), max(part), sum(part) / len(part)))
        verdict = "skipped (fewer than 6 samples)"
        if n >= 6:
            mid = samples[third:2 * third]
            last = samples[2 * third:]
            m_mid, m_last = sum(mid) / len(mid), sum(last) / len(last)
            growth = m_last - m_mid
            verdict = f"last-third mean {mib(m_last):.1f} MiB vs middle {mib(m_mid):.1f} MiB: {mib(growth):+.1f} MiB"
            if growth > 0.10 * m_mid and growth > 8 * 1024:
                self.fail(f"RSS grew after warm-up: {verdict} (limit: +10 % and +8 MiB)")
                verdict += " FAIL"
            else:
                verdict += " ok"
        return phases, verdict


async def main_async(args):
    global switchboard, CuttingProxy
    if args.cuts is not None:
        import switchboard
        from switchboard.cutting_proxy import CuttingProxy
    soak = Soak(args.port, args.pid, args.minutes * 60, args.cuts)
    try:
        stats0, stats, holder = await asyncio.wait_for(soak.run(), soak.seconds + 240)  # never hangs
    except Exception as e:  # a workload could not start, or the server stopped answering: report and fail
        print(f"soak: FAIL: {type(e).__name__}: {e}")
        return 1
    if soak.cuts is None:
        figures = soak.check(stats0, stats)
    else:
        kinds, missing_reported = soak.check_cuts()
    # Everyone leaves; the server must forget them all.
    for c in soak.conns:
        c.close()
    if holder:
        holder.close()
    soak.stop = True
    for entry in soak.cut_clients:  # a resumable client ends its session (END) as it closes
        await entry["client"].close()
    await asyncio.sleep(0.5)  # the ENDs pass the proxies
    for entry in soak.cut_clients:
        await entry["proxy"].close()
    end_stats = None
    for _ in range(50):
        await asyncio.sleep(0.2)
        end_stats = await get_stats(args.port)
        if end_stats.get("connections") == 1 and end_stats.get("repliesPending") == 0 \
                and end_stats.get("registrations") == 0 and (end_stats.get("sessions") or {}).get("parked", 0) == 0:
            break
    else:
        soak.fail(f"after all clients left: connections={end_stats.get('connections')} (want 1), "
                  f"repliesPending={end_stats.get('repliesPending')} (want 0), "
                  f"registrations={end_stats.get('registrations')} (want 0), "
                  f"sessions={end_stats.get('sessions')} (want none parked)")
    await asyncio.sleep(3)
    soak.rss_after = rss_kib(args.pid)
    phases, verdict = soak.check_rss()

    c = soak.c
    sessions0, sessions = stats0.get("sessions") or {}, end_stats.get("sessions") or {}
    delta = lambda key: {k: v - (sessions0.get(key) or {}).get(k, 0) for k, v in (sessions.get(key) or {}).items()
                         if v != (sessions0.get(key) or {}).get(k, 0)}
    rows = [] if soak.cuts is None else [
        ("session rpc calls sent / answered / lost", f"{c['cut_rpc_sent']} / {c['cut_rpc_answers']} / {c['cut_rpc_lost']} "
         "(lost: SessionLostError, each reported by a restart)"),
        ("session posts sent / answered / lost", f"{c['cut_posts']} / {c['cut_post_answers']} / {len(soak.cut_posts_lost)}"),
        ("session listeners", f"{len(soak.cut_listeners)}: events delivered {sum(s['delivered'] for s in soak.cut_listeners)} "
         f"of {c['cut_posts']} x {len(soak.cut_listeners)}; duplicates or out of order "
         f"{sum(s['disorder'] for s in soak.cut_listeners)}; missed after a reported restart {missing_reported}"),
        ("cuts", f"{c['cuts']} connections cut ({c['cut_held']} kept away past the time to live)"),
        ("client session events", ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"),
        ("server sessions (delta)", f"made {sessions.get('made', 0) - sessions0.get('made', 0)}, resumed "
         f"{sessions.get('resumed', 0) - sessions0.get('resumed', 0)}, taken {sessions.get('taken', 0) - sessions0.get('taken', 0)}, "
         f"ended {delta('ended')}, refused {delta('refused')}"),
    ]
    rows += [] if soak.cuts is not None else [
        ("rpc calls sent / answered", f"{c['rpc_sent']} / {c['rpc_answers']}"),
        ("held-channel calls sent / answered", f"{c['held_sent']} / {c['held_answers']} "
         f"({c['held_cancels']} cancelled, {c['held_cancelled_answers']} answered 'cancelled'; holder saw "
         f"{c['holder_requests']} requests, {c['holder_cancels']} cancels)"),
        ("room posts sent / answered", f"{c['posts']} / {c['post_answers']}"),
        ("events posted x listeners", f"{figures['posted']} x {len(soak.listeners)} = "
         f"{figures['posted'] * len(soak.listeners)}"),
        ("events delivered (healthy)", f"{sum(s['delivered'] for s in soak.listeners)} "
         f"(per listener min {min((s['delivered'] for s in soak.listeners), default=0)}, "
         f"max {max((s['delivered'] for s in soak.listeners), default=0)}; missing {figures['healthy_missing']})"),
        ("slow readers", f"{c['slow_joined']} joined, {c['slow_events']} events read, {c['slow_gaps']} gaps, "
         f"closed by the server: {c['slow_closed_slow_consumer']} seen with ERROR slow_consumer, "
         f"{c['slow_closed_reset']} found reset (the ERROR still behind buffered events)"),
        ("server eventsDropped (delta)", f"{figures['dropped']} {stats.get('eventsDropped')}"),
        ("server slowConsumersClosed", f"{figures['slow_closed']}"),
        ("connections churned", f"{c['churn']} ({c['churn_calls']} with a call, {c['churn_text']} text, "
         f"{c['churn_abort_pending']} aborted with a call pending, {c['churn_abort_midframe']} mid-frame)"),
        ("lost / duplicate answers", f"{figures['lost']} / {figures['unexpected']}"),
    ]
    rows += [
        ("server totals", f"connectionsTotal {end_stats.get('connectionsTotal')}, framesIn {end_stats.get('framesIn')}, "
         f"framesOut {end_stats.get('framesOut')}, closes {end_stats.get('closes')}"),
        ("RSS baseline (idle)", f"{mib(soak.rss_baseline):.1f} MiB"),
    ]
    for name, count, lo, hi, mean in phases:
        rows.append((f"RSS {name} ({count} samples)", f"min {mib(lo):.1f}  max {mib(hi):.1f}  mean {mib(mean):.1f} MiB"))
    rows.append(("RSS after (all clients gone)", f"{mib(soak.rss_after):.1f} MiB"))
    rows.append(("RSS growth check", verdict))
    width = max(len(r[0]) for r in rows)
    print("\nsoak summary")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if soak.failures:
        print(f"\nsoak: FAIL ({len(soak.failures)} problem(s)):")
        for f in soak.failures:
            print(f"  - {f}")
        return 1
    print("\nsoak: PASS")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True, help="the server's pid (for RSS)")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--cuts", type=float, help="the cut mode: the fraction of the resumable connections cut every second")
    args = p.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
