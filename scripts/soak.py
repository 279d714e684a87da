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


class Soak:
    def __init__(self, port, pid, seconds):
        self.port, self.pid, self.seconds = port, pid, seconds
        self.loop = asyncio.get_running_loop()
        self.stop = False
        self.failures = []
        self.c = {k: 0 for k in (
            "rpc_sent", "rpc_answers", "held_sent", "held_answers", "held_cancels", "held_cancelled_answers",
            "holder_requests", "holder_cancels", "posts", "post_answers", "churn", "churn_calls",
            "churn_answers", "churn_abort_pending", "churn_abort_midframe", "churn_text",
            "slow_joined", "slow_closed_slow_consumer", "slow_closed_reset", "slow_closed_other", "slow_events", "slow_gaps")}
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
        holder = await self.holder()
        await asyncio.gather(*(self.room_listener(i) for i in range(ROOM_LISTENERS)))
        start = self.loop.time()
        print(f"soak: {self.seconds / 60:.1f} min on port {self.port}: {RPC_CONNS} rpc, {ROOM_LISTENERS} listeners "
              f"+ poster at {ROOM_RATE}/s, held channel with {HELD_CALLERS} callers, {CHURN_WORKERS} churn loops, "
              f"{len(SLOW_READERS)} slow readers", flush=True)
        tasks = [asyncio.create_task(t) for t in (
            [self.rpc_worker(i) for i in range(RPC_CONNS)] + [self.poster()]
            + [self.held_caller(i) for i in range(HELD_CALLERS)]
            + [self.churn_worker(i) for i in range(CHURN_WORKERS)]
            + [self.slow_reader(i, c, p) for i, (c, p) in enumerate(SLOW_READERS)])]
        sampler = asyncio.create_task(self.rss_sampler(start))
        last_report = start
        while self.loop.time() - start < self.seconds:
            await asyncio.sleep(1)
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()
            if self.loop.time() - last_report >= 30:
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
        for t in tasks:
            if not t.done():
                t.cancel()
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
    soak = Soak(args.port, args.pid, args.minutes * 60)
    try:
        stats0, stats, holder = await asyncio.wait_for(soak.run(), soak.seconds + 240)  # never hangs
    except Exception as e:  # a workload could not start, or the server stopped answering: report and fail
        print(f"soak: FAIL: {type(e).__name__}: {e}")
        return 1
    figures = soak.check(stats0, stats)
    # Everyone leaves; the server must forget them all.
    for c in soak.conns:
        c.close()
    holder.close()
    end_stats = None
    for _ in range(50):
        await asyncio.sleep(0.2)
        end_stats = await get_stats(args.port)
        if end_stats.get("connections") == 1 and end_stats.get("repliesPending") == 0 \
                and end_stats.get("registrations") == 0:
            break
    else:
        soak.fail(f"after all clients left: connections={end_stats.get('connections')} (want 1), "
                  f"repliesPending={end_stats.get('repliesPending')} (want 0), "
                  f"registrations={end_stats.get('registrations')} (want 0)")
    await asyncio.sleep(3)
    soak.rss_after = rss_kib(args.pid)
    phases, verdict = soak.check_rss()

    c = soak.c
    rows = [
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
    args = p.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
