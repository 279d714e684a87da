#!/usr/bin/env python3
"""Resource attacks on a running Switchboard server (started by scripts/attacks), one after another.

Each attack is bounded in time. While it runs, a separate process (sbwire.py probe) makes PROBE_CALLS
echo calls one at a time as a well-behaved client, again and again until the attack ends; the server's RSS is read from /proc before (after a
short warm-up), every 0.25 s during (peak), and after (once the attack's sockets are closed and RSS has
settled, at most SETTLE_MAX s).

  1 idle      10,000 connections that send a HELLO, then nothing (a connection that sends nothing at all
              is closed at the first-frame timeout: attack 5).
  2 never-read 5,000 room listeners (4 KiB receive buffers) that never read, while one poster posts
              POST_SIZE bytes POST_RATE times a second until the server has closed all of them as slow
              consumers (stats slowConsumersClosed), at least POSTER_SECONDS and at most 90 s.
  3 trickle   TRICKLERS connections (8, so that an up-front allocation of the declared length would show
              as 128 MiB) each send a MESSAGE header declaring a 16 MiB frame, then one byte per 10 ms
              for TRICKLE_SECONDS.
  4 ping-flood one client sends PINGs (64-byte payload) as fast as the socket takes them for FLOOD_SECONDS
              and never reads its PONGs (4 KiB receive buffer).
  5 slow-text  SLOW_CONNS connections each send `{` and stop: every one must be closed at the first-frame
              timeout (closes.firstFrameTimeout), with an error line `timeout`.
  6 slow-http  SLOW_CONNS connections each send half an HTTP request head and stop: every one must get 408
              and be closed (closes.firstFrameTimeout).
  7 slow-tls   SLOW_TLS_CONNS TLS connections (the server started with TLS): half send half a ClientHello
              record and stop (closed by the handshake timeout, closes.tlsHandshakeTimeout, or the
              first-frame timeout), half finish the handshake, make one call, then send half a TLS record
              and stop (closed at the frame timeout, closes.frameTimeout, with an error line `timeout`).
  8 reconnect  RECONNECT_WORKERS anonymous clients reconnect as fast as they can for RECONNECT_SECONDS: half
              the connections send HELLO and a PING and wait for the PONG, half close without a byte.
  9 reg-flood REG_CONNS anonymous connections each send REG_TRIES REGISTERs of REG_NAME-byte names at once
              (more than the server's per-connection cap, REG_CAP by default): each must hold exactly
              REG_CAP and get too_many_registrations for the rest.
 10 metrics   SCRAPE_CONNS connections hold REG_CAP channels each (40,000 in all), then a client GETs
              /metrics back to back for SCRAPE_SECONDS: scrapes under SCRAPE_LIMIT_MS at p99 and
              SCRAPE_MAX_BYTES, however many channels are held.
 11 parked    (protocol/resumption.md; the server runs with --max-parked-sessions PARKED, --session-ttl
              PARKED_TTL_MS, --cap-loopback --max-connections-per-address PARKED_CAP) PARKED connections
              ask for a session and listen to the room; EVENTS_LIVE events of EVENT_SIZE bytes reach
              them, never acknowledged; they drop (RST) and park; EVENTS_PARKED more are posted, which the
              parked sessions keep. Then: RSS per parked session (the figure), the per-address cap counts
              the parked (connections opened until refused: exactly PARKED_CAP - PARKED admitted), and,
              while probing, PARKED_EXTRA more sessions park in batches: the parked count (sampled every
              0.1 s) never passes PARKED, the oldest are evicted (ended.evicted), an evicted token is
              answered cannot_resume `evicted`, and the newest first-wave session resumes from position
              0 with its listen REPLY and every event replayed. The rest expire before the RSS settles.
 12 bad-tokens FLOOD_WORKERS clients present bad session tokens as fast as they can for FLOOD_SECONDS,
              each on a new connection (the server runs with two users, scripts/attacks): random 32-byte
              tokens (`restarted`: another process's mark), random text (`unknown`), a live session's
              name with a forged secret (`unknown`), the live session's token from another user or
              anonymously (`unknown`, counted `identity`), an ended session's (`ended`, `unknown` once the
              flood's own ended sessions have pushed it out of the 1,000 remembered); one try in
              FLOOD_FALLBACK_ONE_IN then asks for a new session on the same connection and ENDs it.
              Every answer must be cannot_resume with that reason, the refusals counted in stats by
              reason exactly, no session held after, the refusal logged at most once a second (lines
              in the server's log), and the live session untouched (not taken, still answering).

Thresholds (an attack FAILs when any is broken):
  * echo latency during the attack: p99 < 100 ms, and every probe call answered;
  * RSS during: peak - baseline <= the attack's budget (9, 10: REG_BUDGET per channel held + 64 MiB): 4 KiB per idle connection (benchmarks/README.md measures
    1.76 KiB); listeners x outbound limit x 1.25 + 64 MiB for never-readers (the outbound limit is what the
    server may hold per connection); 64 MiB for the trickle; outbound limit + 64 MiB for the flood (a
    connection over its limit should stop being read). A hard cap (HARD_CAP_MIB) ends an attack early;
  * RSS after: <= baseline + max(32 MiB, 25 % of baseline, 2 % of the attack's peak growth) once the
    attack's connections are gone and RSS has settled: the server must give back what an attack made it
    take, less some slack for allocator caches and the pages of the binary the attack touched;
  * the server is still up, and its connection count is back to 1 (the stats reader);
  * 5-7: every slow starter was closed by its deadline within SLOW_HOLD_MAX s, and told why;
  * 11: RSS peak - baseline <= PARKED x (the events each keeps + PARKED_BUDGET KiB) + 64 MiB; 12: 64 MiB.
"""
import argparse
import asyncio
import base64
import json
import os
import random
import socket
import struct
import sys
import time

sys.dont_write_bytecode = True
from sbwire import (END, ERROR, HELLO, MESSAGE, PING, PONG, REGISTER, ROOM, ROOM_POST, REPLY, WELCOME, connect, error_code,
                    frame, get_stats, hello_payload, json_of, method_call, mib, percentile, rss_kib, total_dropped)

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE_CALLS, PROBE_INTERVAL = 300, 0.03
P99_LIMIT_MS = 100.0
HARD_CAP_MIB = 8192
IDLE_CONNS = 10_000
NEVER_READ_CONNS, POST_SIZE, POST_RATE, POSTER_SECONDS = 5_000, 1024, 100, 10
TRICKLERS, TRICKLE_SECONDS, FRAME_LEN = 8, 30, 16 << 20
FLOOD_SECONDS, PING_PAYLOAD = 20, 64
SLOW_CONNS, SLOW_TLS_CONNS, SLOW_HOLD_MAX = 2_000, 500, 30  # the deadlines are 10 s by default
RECONNECT_WORKERS, RECONNECT_SECONDS = 64, 15
SETTLE_MAX = 15
REG_CAP = 1000  # the server's default --max-registrations
REG_CONNS, REG_TRIES, REG_NAME = 40, 1500, 200
SCRAPE_CONNS, SCRAPE_SECONDS, SCRAPE_LIMIT_MS, SCRAPE_MAX_BYTES = 40, 10, 50.0, 1 << 20
REG_BUDGET = 4  # KiB per channel held
PARKED, PARKED_EXTRA, PARKED_BATCH = 1000, 200, 50  # scripts/attacks: --max-parked-sessions PARKED
PARKED_CAP, PARKED_TTL_MS = PARKED + 100, 20_000  # scripts/attacks: --max-connections-per-address, --session-ttl
EVENTS_LIVE, EVENTS_PARKED, EVENT_SIZE = 4, 4, 1024
PARKED_BUDGET = 16  # KiB per parked session beyond the events it keeps
FLOOD_WORKERS, FLOOD_SECONDS, FLOOD_FALLBACK_ONE_IN = 32, 15, 10
USERS = {"alice": "attack-alice", "bob": "attack-bob"}  # scripts/attacks' access configuration: name -> HELLO token


class Attack:
    def __init__(self, args):
        self.port, self.pid, self.limit = args.port, args.pid, args.outbound_limit
        self.tls_port, self.ca = args.tls_port, args.ca
        self.server_log = args.server_log
        self.body_failures = []  # reasons an attack's body found to fail it (see run)
        self.loop = asyncio.get_running_loop()
        self.failed = []
        self.peak = 0
        self.capped = False

    def rss(self):
        return rss_kib(self.pid)

    async def open_sockets(self, n, rcvbuf=None, first=None, batch=250):
        """n connected non-blocking sockets (each sends `first` if given)."""
        socks = []

        async def one():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if rcvbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.setblocking(False)
            await asyncio.wait_for(self.loop.sock_connect(s, ("127.0.0.1", self.port)), 30)
            if first:
                await self.loop.sock_sendall(s, first)
            socks.append(s)
        for start in range(0, n, batch):
            await asyncio.gather(*(one() for _ in range(min(batch, n - start))))
        return socks

    async def sample(self, stop):
        """RSS every 0.25 s until `stop` is set; keeps the peak; sets self.capped past HARD_CAP_MIB."""
        while not stop.is_set():
            kib = self.rss()
            self.peak = max(self.peak, kib)
            if kib > HARD_CAP_MIB * 1024 and not self.capped:
                self.capped = True
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except asyncio.TimeoutError:
                pass

    async def probe(self, count=PROBE_CALLS, interval=PROBE_INTERVAL):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.join(HERE, "sbwire.py"), "probe", str(self.port), str(count), str(interval),
            stdout=asyncio.subprocess.PIPE)
        self.probe_proc = proc
        out, _ = await proc.communicate()
        try:
            return json.loads(out)
        except ValueError:
            return {"lat": [], "failures": count}

    async def settle(self):
        """RSS once it stops falling (or after SETTLE_MAX s)."""
        last, stable_since, t0 = self.rss(), time.monotonic(), time.monotonic()
        while time.monotonic() - t0 < SETTLE_MAX:
            await asyncio.sleep(0.5)
            now = self.rss()
            if abs(now - last) > 256:
                stable_since = time.monotonic()
            last = now
            if time.monotonic() - stable_since >= 3:
                break
        return last

    async def run(self, number, name, body, budget_kib):
        """body(hold) sets up the attack, awaits hold() while it lasts, then releases everything;
        returns a dict of extra figures."""
        self.peak = 0
        self.capped = False
        await self.probe(50, 0.0)  # warm-up
        await asyncio.sleep(1)
        stats0 = await get_stats(self.port)
        base = self.rss()
        stop = asyncio.Event()
        sampler = asyncio.create_task(self.sample(stop))
        probe_result = {}

        async def hold(seconds=0, done=None, limit=90):
            """Keeps the attack in place while latency probes run back to back: at least one probe, then
            until `seconds` have passed and the async predicate `done` (if any) holds, at most `limit` s."""
            t0 = time.monotonic()
            lat, failures = [], 0
            while not self.capped:
                task = asyncio.create_task(self.probe())
                while not task.done() and not self.capped:
                    await asyncio.sleep(0.25)
                if not task.done():
                    self.probe_proc.kill()
                    break
                r = task.result()
                lat += r["lat"]
                failures += r["failures"]
                elapsed = time.monotonic() - t0
                if elapsed >= limit or (elapsed >= seconds and (done is None or await done())):
                    break
            probe_result.update(lat=lat, failures=failures)
        started = time.monotonic()
        self.body_failures = []
        extra = await body(hold)
        duration = time.monotonic() - started
        stop.set()
        await sampler
        after = await self.settle()
        try:
            stats1 = await get_stats(self.port)
        except OSError as e:
            self.failed.append(f"attack {number}: the server no longer answers: {e}")
            stats1 = {}
        lat = probe_result.get("lat", [])
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        reasons = []
        if self.capped:
            reasons.append(f"RSS passed the {HARD_CAP_MIB} MiB hard cap; attack stopped early")
        if probe_result.get("failures"):
            reasons.append(f"{probe_result['failures']} probe call(s) failed or timed out")
        if not lat or p99 >= P99_LIMIT_MS:
            reasons.append(f"echo p99 {p99:.1f} ms >= {P99_LIMIT_MS:.0f} ms")
        if self.peak - base > budget_kib:
            reasons.append(f"RSS peak +{mib(self.peak - base):.1f} MiB over the budget of +{mib(budget_kib):.1f} MiB")
        after_limit = max(32 * 1024, base // 4, (self.peak - base) // 50)
        if after - base > after_limit:
            reasons.append(f"RSS after +{mib(after - base):.1f} MiB over +{mib(after_limit):.1f} MiB")
        reasons += self.body_failures
        if stats1 and stats1.get("connections") != 1:
            reasons.append(f"{stats1.get('connections')} connections left (want 1)")
        delta = lambda key: (stats1.get(key, 0) - stats0.get(key, 0)) if stats1 else "?"
        closes = {k: v - (stats0.get("closes") or {}).get(k, 0) for k, v in (stats1.get("closes") or {}).items()
                  if v != (stats0.get("closes") or {}).get(k, 0)}
        verdict = "PASS" if not reasons else "FAIL"
        print(f"{number} {name:<11} {duration:5.1f} s | RSS base {mib(base):7.1f}  peak {mib(self.peak):7.1f}  "
              f"after {mib(after):7.1f} MiB | echo p50 {p50:6.2f} ms  p99 {p99:7.2f} ms ({len(lat)} calls) | "
              f"slowConsumersClosed +{delta('slowConsumersClosed')}, eventsDropped "
              f"+{(total_dropped(stats1) - total_dropped(stats0)) if stats1 else '?'}, closes {closes} | "
              f"{extra} | {verdict}", flush=True)
        for r in reasons:
            print(f"    {verdict}: {r}", flush=True)
            self.failed.append(f"attack {number} ({name}): {r}")

    # ---- 1: idle connections
    async def idle(self, hold):
        socks = await self.open_sockets(IDLE_CONNS, first=frame(HELLO, 1, "", None))
        stats = await get_stats(self.port)
        await hold()
        for s in socks:
            s.close()
        return f"{len(socks)} open, server saw {stats.get('connections')} connections"

    # ---- 2: listeners that never read, and a poster
    async def never_read(self, hold):
        listen = frame(MESSAGE, 1, ROOM, method_call("listen", None))
        socks = await self.open_sockets(NEVER_READ_CONNS, rcvbuf=4096, first=listen)
        await asyncio.sleep(1)  # the listens are processed
        poster = await connect(self.port, name="poster")
        post_lat, posts = [], 0
        payload = bytes(POST_SIZE - 8)
        stop_posting = asyncio.Event()

        async def post_loop():
            nonlocal posts
            next_t = self.loop.time()
            while not stop_posting.is_set() and not self.capped:
                posts += 1
                t = time.perf_counter()
                kind, body = await poster.call(ROOM_POST, struct.pack(">Q", posts) + payload)
                post_lat.append((time.perf_counter() - t) * 1000)
                next_t += 1.0 / POST_RATE
                await asyncio.sleep(max(0, next_t - self.loop.time()))
        task = asyncio.create_task(post_loop())
        slow0 = (await get_stats(self.port)).get("slowConsumersClosed", 0)
        closed_after = None

        async def all_closed():
            nonlocal closed_after
            n = (await get_stats(self.port)).get("slowConsumersClosed", 0) - slow0
            if n >= NEVER_READ_CONNS and closed_after is None:
                closed_after = time.monotonic() - t0
            return n >= NEVER_READ_CONNS
        t0 = time.monotonic()
        await hold(POSTER_SECONDS, all_closed)
        stop_posting.set()
        await task
        poster.close()
        for s in socks:
            s.close()
        return (f"{len(socks)} listeners, {posts} posts of {POST_SIZE} B, post p50 {percentile(post_lat, 50):.1f} ms "
                f"p99 {percentile(post_lat, 99):.1f} ms, all closed as slow consumers after "
                + (f"{closed_after:.0f} s of posting" if closed_after else "- (not within the attack)"))

    # ---- 3: a 16 MiB frame, one byte per 10 ms
    async def trickle(self, hold):
        channel = b"switchboard/echo"
        head = struct.pack(">IBBHI", FRAME_LEN, MESSAGE, 0, len(channel), 1) + channel
        socks = await self.open_sockets(TRICKLERS)
        sent = 0
        closed_early = 0
        stop = asyncio.Event()

        async def drip(s):
            nonlocal sent, closed_early
            i = 0
            while not stop.is_set():
                b = head[i:i + 1] if i < len(head) else b"\x00"
                try:
                    await self.loop.sock_sendall(s, b)
                except OSError:
                    closed_early += 1
                    return
                sent += 1
                i += 1
                await asyncio.sleep(0.01)
        tasks = [asyncio.create_task(drip(s)) for s in socks]
        await hold(TRICKLE_SECONDS)
        stop.set()
        await asyncio.gather(*tasks)
        for s in socks:
            s.close()
        return (f"{TRICKLERS} x MESSAGE declaring {FRAME_LEN} B, {sent // TRICKLERS} B sent each, "
                f"{closed_early} closed by the server")

    # ---- 4: PING flood, PONGs never read
    async def ping_flood(self, hold):
        s = (await self.open_sockets(1, rcvbuf=4096))[0]
        batch = b"".join(frame(PING, i + 1, "", bytes(PING_PAYLOAD)) for i in range(1000))
        sent = 0
        stop = asyncio.Event()
        closed = None

        async def flood():
            nonlocal sent, closed
            while not stop.is_set() and not self.capped:
                try:
                    await asyncio.wait_for(self.loop.sock_sendall(s, batch), 1.0)
                    sent += 1000
                except asyncio.TimeoutError:
                    continue  # the server stopped reading us: keep trying until the time is up
                except OSError as e:
                    closed = type(e).__name__
                    return
                await asyncio.sleep(0)
        task = asyncio.create_task(flood())
        await hold(FLOOD_SECONDS)
        stop.set()
        await task
        s.close()
        return f"{sent} PINGs sent ({sent * len(batch) // 1000 / 2**20:.0f} MiB), flooder closed: {closed or 'no'}"

    # ---- 9 and 10: channels held by REGISTER
    async def register_all(self, conns, tries, name_length, prefix):
        """Each of `conns` new connections sends `tries` REGISTERs at once; returns the connections (still
        open: they hold what they got) and, per connection, how many were held and refused."""
        peers = [await connect(self.port, name=f"{prefix}{c}") for c in range(conns)]

        async def flood(c, peer):
            futures = []
            for n in range(tries):
                name = f"{prefix}/{c}/{n}/".ljust(name_length, "x")
                futures.append(peer.request(REGISTER, name, None)[1])
            answers = await asyncio.gather(*futures)
            held = sum(1 for kind, _ in answers if kind == REPLY)
            refused = sum(1 for kind, payload in answers if kind == ERROR and error_code(payload) == "too_many_registrations")
            return held, refused
        counts = await asyncio.gather(*(flood(c, peer) for c, peer in enumerate(peers)))
        return peers, counts

    def check_cap(self, number, counts, tries):
        wrong = [(c, held, refused) for c, (held, refused) in enumerate(counts) if held != REG_CAP or refused != tries - REG_CAP]
        if wrong:
            reason = f"attack {number}: {len(wrong)} connection(s) held other than {REG_CAP} (first: {wrong[0]})"
            print(f"    FAIL: {reason}", flush=True)
            self.failed.append(reason)

    async def registration_flood(self, hold):
        flooding = asyncio.create_task(self.register_all(REG_CONNS, REG_TRIES, REG_NAME, "flood"))

        async def flooded():
            return flooding.done()
        await hold(0, flooded)
        peers, counts = await flooding
        held_now = (await get_stats(self.port)).get("registrations")
        for peer in peers:
            peer.close()
        self.check_cap(9, counts, REG_TRIES)
        return (f"{REG_CONNS} x {REG_TRIES} REGISTERs of {REG_NAME} B names: {sum(h for h, _ in counts)} held "
                f"(stats {held_now}), {sum(r for _, r in counts)} too_many_registrations")

    async def metrics_scrape(self, hold):
        peers, counts = await self.register_all(SCRAPE_CONNS, REG_CAP, 24, "m")
        scrapes, sizes = [], []
        stop = asyncio.Event()

        async def scrape_loop():
            while not stop.is_set():
                t = time.perf_counter()
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                body = await reader.read()
                scrapes.append((time.perf_counter() - t) * 1000)
                sizes.append(len(body))
                writer.close()
        task = asyncio.create_task(scrape_loop())
        await hold(SCRAPE_SECONDS)
        stop.set()
        await task
        for peer in peers:
            peer.close()
        self.check_cap(10, counts, REG_CAP)
        slowest, largest = max(scrapes, default=0), max(sizes, default=0)
        if not scrapes or percentile(scrapes, 99) >= SCRAPE_LIMIT_MS or largest > SCRAPE_MAX_BYTES:
            reason = (f"attack 10: scrapes ({len(scrapes)}) took {percentile(scrapes, 99):.1f} ms at p99 (limit {SCRAPE_LIMIT_MS:.0f}) "
                      f"and up to {largest} B (limit {SCRAPE_MAX_BYTES})")
            print(f"    FAIL: {reason}", flush=True)
            self.failed.append(reason)
        return (f"{sum(h for h, _ in counts)} channels held; {len(scrapes)} scrapes of /metrics: p50 "
                f"{percentile(scrapes, 50):.1f} ms, p99 {percentile(scrapes, 99):.1f} ms, max {slowest:.1f} ms, up to {largest} B")


    # ---- 11 and 12: resumable sessions
    async def ask_session(self, conn, token=None, resume=None):
        """HELLO asking for a new session (or resuming `resume`, a (token, position) pair) on `conn`;
        returns the answer's (kind, JSON payload)."""
        session = {} if resume is None else {"token": resume[0], "position": resume[1]}
        fields = {"session": session} if token is None else {"token": token, "session": session}
        kind, payload = await asyncio.wait_for(conn.call("", hello_payload(**fields), kind=HELLO), 10)
        return kind, json_of(payload)

    async def make_sessions(self, n, prefix, received=None):
        """n connections, each with a new session and listening to the room; returns (connections,
        tokens). `received[i]`, if given, counts the room events connection i gets."""
        conns = []
        for start in range(0, n, 100):
            def counter(i):
                def on_frame(conn, f):
                    if f[0] == MESSAGE and f[2] == 0 and f[3] == ROOM and received is not None:
                        received[i] += 1
                return on_frame
            conns += await asyncio.gather(*(connect(self.port, counter(i), f"{prefix}{i}")
                                            for i in range(start, min(n, start + 100))))

        async def one(conn):
            kind, answer = await self.ask_session(conn)
            listened, _ = await asyncio.wait_for(conn.call(ROOM, method_call("listen", None)), 10)
            token = (answer.get("session") or {}).get("token")
            if kind != WELCOME or not token or listened != REPLY:
                raise RuntimeError(f"{conn.name}: no session ({kind}, {answer})")
            return token
        return conns, await asyncio.gather(*(one(c) for c in conns))

    async def sessions(self):
        return (await get_stats(self.port)).get("sessions") or {}

    async def post_room(self, count):
        poster = await connect(self.port, name="poster")
        for n in range(count):
            kind, _ = await asyncio.wait_for(poster.call(ROOM_POST, struct.pack(">Q", n) + bytes(EVENT_SIZE - 8)), 10)
            if kind != REPLY:
                raise RuntimeError(f"room.post answered {kind}")
        poster.close()

    async def wait_for(self, predicate, seconds, what):
        t0 = time.monotonic()
        while not await predicate():
            if time.monotonic() - t0 > seconds:
                raise RuntimeError(f"not within {seconds} s: {what}")
            await asyncio.sleep(0.2)

    async def parked_sessions(self, hold):
        base = self.rss()
        received = [0] * PARKED
        conns, tokens = await self.make_sessions(PARKED, "parked", received)
        await self.post_room(EVENTS_LIVE)

        async def all_received():
            return min(received) >= EVENTS_LIVE
        await self.wait_for(all_received, 20, f"{EVENTS_LIVE} events at every session")
        live_rss = self.rss()
        for c in conns:
            c.abort()

        async def all_parked():
            return (await self.sessions()).get("parked") == PARKED
        await self.wait_for(all_parked, 20, f"{PARKED} sessions parked")
        await self.post_room(EVENTS_PARKED)
        await asyncio.sleep(1)
        held = await self.sessions()
        parked_rss = await self.settle()
        per_session = (parked_rss - base) / PARKED
        kept = held.get("bufferedBytes", 0) / PARKED / 1024

        # The per-address cap counts the parked sessions: connections from this address until refused.
        admitted, refused = 0, 0
        socks = []
        for _ in range(PARKED_CAP - PARKED + 20):
            s = (await self.open_sockets(1, first=frame(PING, 1)))[0]
            try:
                answer = await asyncio.wait_for(self.loop.sock_recv(s, 64), 5)
            except (asyncio.TimeoutError, OSError):
                answer = b""
            if answer:
                admitted += 1
                socks.append(s)
            else:
                refused += 1
                s.close()
        for s in socks:
            s.close()

        async def released():  # a stats connection may be refused until the server has seen the closes
            try:
                return (await get_stats(self.port)).get("connections") == 1
            except ConnectionError:
                return False
        await self.wait_for(released, 10, "the connections that tested the cap are gone")
        if admitted != PARKED_CAP - PARKED:
            self.body_failures.append(f"{admitted} connections admitted beside {PARKED} parked sessions under a cap of "
                                      f"{PARKED_CAP} per address (want {PARKED_CAP - PARKED})")

        # More sessions park while the probes run: the oldest are evicted, never more than PARKED parked.
        parked_max, stop_sampling = 0, asyncio.Event()

        async def sample_parked():
            nonlocal parked_max
            while not stop_sampling.is_set():
                parked_max = max(parked_max, (await self.sessions()).get("parked", 0))
                await asyncio.sleep(0.1)
        evicted0 = (held.get("ended") or {}).get("evicted", 0)
        sampler = asyncio.create_task(sample_parked())

        async def park_more():
            for b in range(PARKED_EXTRA // PARKED_BATCH):
                extra, _ = await self.make_sessions(PARKED_BATCH, f"extra{b}-")
                for c in extra:
                    c.abort()
                await asyncio.sleep(0.2)
        parking = asyncio.create_task(park_more())

        async def parked_all():
            return parking.done()
        await hold(0, parked_all)
        await parking
        stop_sampling.set()
        await sampler
        after = await self.sessions()
        evicted = (after.get("ended") or {}).get("evicted", 0) - evicted0
        if parked_max > PARKED or after.get("parked") != PARKED:
            self.body_failures.append(f"parked sessions: up to {parked_max}, {after.get('parked')} at the end (cap {PARKED})")
        if evicted != PARKED_EXTRA:
            self.body_failures.append(f"{evicted} sessions evicted, want {PARKED_EXTRA}")

        # The oldest session was evicted and says so; the newest of the first wave resumes with everything.
        conn = await connect(self.port, name="evicted")
        kind, answer = await self.ask_session(conn, resume=(tokens[0], 0))
        reason = ((answer.get("details") or {}).get("reason"))
        if kind != ERROR or answer.get("code") != "cannot_resume" or reason != "evicted":
            self.body_failures.append(f"an evicted session's token was answered {kind} {answer}")
        conn.close()
        replayed = []
        conn = await connect(self.port, lambda c, f: replayed.append(f[0]), name="resumer")
        kind, answer = await self.ask_session(conn, resume=(tokens[-1], 0))
        await asyncio.sleep(1)
        events = sum(1 for k in replayed if k == MESSAGE)
        # The old connection's listen (id 2, after its HELLO) is answered again: this connection's HELLO had id 1.
        answers = [(k, fid) for k, fid, _ in conn.unexpected]
        if kind != WELCOME or not (answer.get("session") or {}).get("resumed") or events != EVENTS_LIVE + EVENTS_PARKED \
                or answers != [(REPLY, 2)]:
            self.body_failures.append(f"resuming a parked session from 0: {kind} {answer}, {events} events replayed "
                                      f"(want {EVENTS_LIVE + EVENTS_PARKED}), answers {conn.unexpected[:2]}")
        conn.send(frame(END))
        conn.close()

        async def none_parked():
            return (await self.sessions()).get("parked") == 0
        await self.wait_for(none_parked, PARKED_TTL_MS / 1000 + 20, "the parked sessions expire")
        return (f"{PARKED} parked: RSS +{mib(live_rss - base):.1f} MiB live, +{mib(parked_rss - base):.1f} MiB parked = "
                f"{per_session:.1f} KiB per parked session (keeping {kept:.1f} KiB of output each); "
                f"{admitted} admitted and {refused} refused beside them under the cap of {PARKED_CAP}; "
                f"{PARKED_EXTRA} more parked: at most {parked_max} parked, {evicted} evicted")

    async def bad_tokens(self, hold):
        alice, ended = await connect(self.port, name="alice"), await connect(self.port, name="ended")
        (_, a), (_, e) = await self.ask_session(alice, USERS["alice"]), await self.ask_session(ended, USERS["alice"])
        live_token, ended_token = a["session"]["token"], e["session"]["token"]
        ended.send(frame(END))
        ended.close()
        b64 = lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        name = base64.urlsafe_b64decode(live_token + "=")[:16]
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.! é"
        # kind: (the HELLO's token, the session token, the reason told, the reason counted)
        kinds = {
            "random": lambda r: (None, b64(os.urandom(32)), "restarted", "restarted"),
            "garbage": lambda r: (None, "".join(r.choice(alphabet) for _ in range(r.randrange(0, 300))), "unknown", "unknown"),
            "forged": lambda r: (USERS["alice"], b64(name + os.urandom(16)), "unknown", "unknown"),
            "other-user": lambda r: (USERS["bob"], live_token, "unknown", "identity"),
            "anonymous": lambda r: (None, live_token, "unknown", "identity"),
            "ended": lambda r: (USERS["alice"], ended_token, "ended", "ended"),
        }
        # The server remembers why the last --max-parked-sessions (1,000 here) sessions ended: the new
        # sessions the flood makes and ends push the ended one out, after which it is `unknown`.
        remembered = 1000 - FLOOD_WORKERS
        await asyncio.sleep(0.5)
        stats0 = await get_stats(self.port)
        log0 = self.refusal_log_lines()
        tries = {k: 0 for k in kinds}
        counted = {}
        wrong, fallbacks = [], 0
        stop = asyncio.Event()

        async def worker(index):
            nonlocal fallbacks
            r = random.Random(index)
            while not stop.is_set():
                kind_name = r.choice(list(kinds))
                user, token, told, count_as = kinds[kind_name](r)
                conn = await connect(self.port, name=f"flood{index}")
                try:
                    kind, answer = await self.ask_session(conn, user, resume=(token, 0))
                    tries[kind_name] += 1
                    reason = (answer.get("details") or {}).get("reason")
                    if kind_name == "ended" and fallbacks >= remembered and reason == "unknown":
                        told = count_as = "unknown"
                    counted[count_as] = counted.get(count_as, 0) + 1
                    if kind != ERROR or answer.get("code") != "cannot_resume" or reason != told:
                        wrong.append(f"{kind_name}: {kind} {answer}")
                    elif r.randrange(FLOOD_FALLBACK_ONE_IN) == 0:  # the connection's one further try: a new session
                        kind, answer = await self.ask_session(conn, user)
                        if kind != WELCOME or not (answer.get("session") or {}).get("token"):
                            wrong.append(f"{kind_name}: a new session after cannot_resume was answered {kind} {answer}")
                        conn.send(frame(END))
                        fallbacks += 1
                except (asyncio.TimeoutError, ConnectionError) as e:
                    wrong.append(f"{kind_name}: {type(e).__name__} {e}")
                finally:
                    conn.close()
        workers = [asyncio.create_task(worker(i)) for i in range(FLOOD_WORKERS)]
        t0 = time.monotonic()
        await hold(FLOOD_SECONDS)
        stop.set()
        await asyncio.gather(*workers)
        seconds = time.monotonic() - t0
        await asyncio.sleep(0.5)
        stats1 = await get_stats(self.port)
        log_lines = self.refusal_log_lines() - log0
        refused = {k: v - ((stats0.get("sessions") or {}).get("refused") or {}).get(k, 0)
                   for k, v in ((stats1.get("sessions") or {}).get("refused") or {}).items()}
        refused = {k: v for k, v in refused.items() if v}
        s0, s1 = stats0.get("sessions") or {}, stats1.get("sessions") or {}
        kind, echoed = await asyncio.wait_for(alice.call("switchboard/echo", method_call("echo", "still here")), 10)
        if wrong:
            self.body_failures.append(f"{len(wrong)} wrong answer(s), e.g. {wrong[:3]}")
        if refused != counted:
            self.body_failures.append(f"stats count refusals {refused}, the clients saw {counted}")
        for key in ("live", "parked", "bufferedBytes"):
            if s1.get(key) != s0.get(key):
                self.body_failures.append(f"sessions {key}: {s0.get(key)} before the flood, {s1.get(key)} after")
        if alice.closed.done() or alice.errors or kind != REPLY:
            self.body_failures.append(f"the live session was disturbed: closed={alice.closed.done()} errors={alice.errors} echo={kind}")
        if self.server_log and not 1 <= log_lines <= seconds + 2:
            self.body_failures.append(f"{log_lines} refusal lines logged in {seconds:.0f} s (want 1 … one a second)")
        alice.send(frame(END))
        alice.close()
        total = sum(tries.values())
        return (f"{total} bad tokens in {seconds:.0f} s ({total / seconds:.0f}/s: "
                + ", ".join(f"{k} {v}" for k, v in tries.items()) + f"), {fallbacks} new sessions after the refusal; "
                f"stats refused +{refused}; {log_lines if self.server_log else '?'} log lines")

    def refusal_log_lines(self):
        if not self.server_log:
            return 0
        with open(self.server_log, errors="replace") as f:
            return sum(1 for line in f if "refusing to resume" in line)

    # ---- 5-7: slow starts, closed at their deadlines
    async def closes_by(self, reason):
        """Closes counted for `reason`, or the sum for a tuple of reasons."""
        closes = (await get_stats(self.port)).get("closes") or {}
        return sum(closes.get(r, 0) for r in (reason if isinstance(reason, tuple) else (reason,)))

    async def held_until_closed(self, hold, reason, count, expected_reply, sample_reader):
        """Holds the slow starters (probing) until the server has closed `count` more connections for
        `reason` (or any of a tuple); checks what one of them was told. Returns the figures."""
        base = await self.closes_by(reason)
        t0 = time.monotonic()
        closed_after = None

        async def watch():  # every 0.25 s, so that the time they were closed is known to that
            nonlocal closed_after
            while time.monotonic() - t0 < SLOW_HOLD_MAX:
                if await self.closes_by(reason) - base >= count:
                    closed_after = time.monotonic() - t0
                    return
                await asyncio.sleep(0.25)
        watcher = asyncio.create_task(watch())

        async def all_closed():
            return watcher.done()
        await hold(0, all_closed, SLOW_HOLD_MAX)
        await watcher
        closed = await self.closes_by(reason) - base
        told = await sample_reader()
        if closed < count:
            self.body_failures.append(f"only {closed} of {count} slow starters closed as {reason} within {SLOW_HOLD_MAX} s")
        if not told.startswith(expected_reply):
            self.body_failures.append(f"a slow starter was told {told[:60]!r}, not {expected_reply!r}…")
        return (f"{count} slow starters, {closed} closed as {reason} "
                + (f"{closed_after:.1f} s after the last one connected" if closed_after is not None else "(not all)")
                + f", one was told {told[:48]!r}")

    async def slow_plain(self, hold, first, reason, expected_reply):
        socks = await self.open_sockets(SLOW_CONNS, first=first)

        async def told():
            s, out = socks[0], b""
            try:
                while True:
                    chunk = await asyncio.wait_for(self.loop.sock_recv(s, 4096), 5)
                    if not chunk:
                        break
                    out += chunk
            except (asyncio.TimeoutError, OSError):
                pass
            return out.decode(errors="replace")
        figures = await self.held_until_closed(hold, reason, SLOW_CONNS, expected_reply, told)
        for s in socks:
            s.close()
        return figures

    async def slow_text(self, hold):
        return await self.slow_plain(hold, b"{", "firstFrameTimeout", '{"error":{"code":"timeout"')

    async def slow_http(self, hold):
        return await self.slow_plain(hold, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", "firstFrameTimeout",
                                     "HTTP/1.1 408")

    async def slow_tls(self, hold):
        if not self.tls_port:
            raise RuntimeError("slow-tls needs a server with TLS (--tls-port, --ca)")
        import ssl
        context = ssl.create_default_context(cafile=self.ca)
        streams, hellos = [], []

        async def half_hello():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            await self.loop.sock_connect(s, ("127.0.0.1", self.tls_port))
            # A handshake record declaring 512 bytes, then 40 of them.
            await self.loop.sock_sendall(s, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(34))
            hellos.append(s)

        async def one():
            reader, writer = await asyncio.open_connection("127.0.0.1", self.tls_port, ssl=context,
                                                           server_hostname="127.0.0.1")
            writer.write(b'{"id":1,"ping":true}\n')
            await writer.drain()
            await asyncio.wait_for(reader.readline(), 10)
            # Half an application-data record: a header declaring 64 bytes, then 10 of them.
            os.write(writer.get_extra_info("socket").fileno(), b"\x17\x03\x03\x00\x40" + bytes(10))
            streams.append((reader, writer))
        for start in range(0, SLOW_TLS_CONNS // 2, 100):
            await asyncio.gather(*(one() for _ in range(min(100, SLOW_TLS_CONNS // 2 - start))))
            await asyncio.gather(*(half_hello() for _ in range(min(100, SLOW_TLS_CONNS // 2 - start))))

        async def told():
            try:
                return (await asyncio.wait_for(streams[0][0].read(4096), 5)).decode(errors="replace")
            except (asyncio.TimeoutError, OSError, ssl.SSLError) as e:
                return f"({type(e).__name__})"
        reasons = ("frameTimeout", "tlsHandshakeTimeout", "firstFrameTimeout")
        figures = await self.held_until_closed(hold, reasons, len(streams) + len(hellos), '{"error":{"code":"timeout"', told)
        for _, writer in streams:
            writer.transport.abort()
        for s in hellos:
            s.close()
        return f"{len(hellos)} half ClientHellos, {len(streams)} half records after a call: {figures}"

    # ---- 8: anonymous clients that reconnect as fast as they can
    async def reconnect_flood(self, hold):
        stop = asyncio.Event()
        rounds, failures = 0, 0
        greeting = frame(HELLO, 1, "", None) + frame(PING, 2, "", None)

        async def worker(index):
            nonlocal rounds, failures
            while not stop.is_set():
                writer = None
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                    if (index + rounds) % 2:
                        writer.write(greeting)
                        while True:  # WELCOME, then PONG
                            (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
                            body = await asyncio.wait_for(reader.readexactly(length), 5)
                            if body[0] == PONG:
                                break
                    rounds += 1
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    failures += 1
                finally:
                    if writer is not None:
                        writer.transport.abort()
        tasks = [asyncio.create_task(worker(i)) for i in range(RECONNECT_WORKERS)]
        t0 = time.monotonic()
        await hold(RECONNECT_SECONDS)
        stop.set()
        await asyncio.gather(*tasks)
        seconds = time.monotonic() - t0
        if failures:
            self.body_failures.append(f"{failures} reconnecting client(s) failed")
        return f"{RECONNECT_WORKERS} clients, {rounds} connections ({rounds / seconds:.0f}/s), {failures} failed"


async def main_async(args):
    a = Attack(args)
    print(f"server pid {a.pid} port {a.port}, outbound limit {a.limit} B; limits: echo p99 {P99_LIMIT_MS:.0f} ms, "
          f"hard RSS cap {HARD_CAP_MIB} MiB", flush=True)
    plan = [
        (1, "idle", a.idle, IDLE_CONNS * 4),
        (2, "never-read", a.never_read, int(NEVER_READ_CONNS * a.limit / 1024 * 1.25) + 64 * 1024),
        (3, "trickle", a.trickle, 64 * 1024),
        (4, "ping-flood", a.ping_flood, a.limit // 1024 + 64 * 1024),
        (5, "slow-text", a.slow_text, SLOW_CONNS * 16 + 32 * 1024),
        (6, "slow-http", a.slow_http, SLOW_CONNS * 16 + 32 * 1024),
        (7, "slow-tls", a.slow_tls, SLOW_TLS_CONNS * 64 + 32 * 1024),
        (8, "reconnect", a.reconnect_flood, 64 * 1024),
        (9, "reg-flood", a.registration_flood, REG_CONNS * REG_CAP * REG_BUDGET + 64 * 1024),
        (10, "metrics", a.metrics_scrape, SCRAPE_CONNS * REG_CAP * REG_BUDGET + 64 * 1024),
        (11, "parked", a.parked_sessions, PARKED * ((EVENTS_LIVE + EVENTS_PARKED) * EVENT_SIZE // 1024 + PARKED_BUDGET) + 64 * 1024),
        (12, "bad-tokens", a.bad_tokens, 64 * 1024),
    ]
    for number, name, body, budget in plan:
        if args.only and str(number) not in args.only.split(","):
            continue
        try:
            await a.run(number, name, body, budget)
        except Exception as e:
            a.failed.append(f"attack {number} ({name}): {type(e).__name__}: {e}")
            print(f"{number} {name}: FAIL: {type(e).__name__}: {e}", flush=True)
        if not os.path.exists(f"/proc/{a.pid}"):
            a.failed.append("the server is gone")
            break
    return 1 if a.failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--outbound-limit", type=int, required=True, help="the server's --outbound-limit")
    p.add_argument("--only", help="comma-separated attack numbers, e.g. 1,3")
    p.add_argument("--tls-port", type=int, help="the server's TLS port (attack 7)")
    p.add_argument("--ca", help="the CA that signed the server's TLS certificate (attack 7)")
    p.add_argument("--server-log", help="the server's log (attack 12 counts its refusal lines)")
    args = p.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
