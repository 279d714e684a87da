#!/usr/bin/env python3
"""Resource attacks on a running Switchboard server (started by scripts/attacks), one after another.

Each attack is bounded in time. While it runs, a separate process (sbwire.py probe) makes PROBE_CALLS
echo calls one at a time as a well-behaved client, again and again until the attack ends; the server's RSS is read from /proc before (after a
short warm-up), every 0.25 s during (peak), and after (once the attack's sockets are closed and RSS has
settled, at most SETTLE_MAX s).

  1 idle      10,000 connections that send nothing.
  2 never-read 5,000 room listeners (4 KiB receive buffers) that never read, while one poster posts
              POST_SIZE bytes POST_RATE times a second until the server has closed all of them as slow
              consumers (stats slowConsumersClosed), at least POSTER_SECONDS and at most 90 s.
  3 trickle   TRICKLERS connections (8, so that an up-front allocation of the declared length would show
              as 128 MiB) each send a MESSAGE header declaring a 16 MiB frame, then one byte per 10 ms
              for TRICKLE_SECONDS.
  4 ping-flood one client sends PINGs (64-byte payload) as fast as the socket takes them for FLOOD_SECONDS
              and never reads its PONGs (4 KiB receive buffer).
 10 reg-flood REG_CONNS anonymous connections each send REG_TRIES REGISTERs of REG_NAME-byte names at once
              (more than the server's per-connection cap, REG_CAP by default): each must hold exactly
              REG_CAP and get too_many_registrations for the rest.
 11 metrics   SCRAPE_CONNS connections hold REG_CAP channels each (40,000 in all), then a client GETs
              /metrics back to back for SCRAPE_SECONDS: scrapes under SCRAPE_LIMIT_MS at p99 and
              SCRAPE_MAX_BYTES, however many channels are held.

Thresholds (an attack FAILs when any is broken):
  * echo latency during the attack: p99 < 100 ms, and every probe call answered;
  * RSS during: peak - baseline <= the attack's budget (10, 11: REG_BUDGET per channel held + 64 MiB): 4 KiB per idle connection (the README measures
    1.4 KiB); listeners x outbound limit x 1.25 + 64 MiB for never-readers (the outbound limit is what the
    server may hold per connection); 64 MiB for the trickle; outbound limit + 64 MiB for the flood (a
    connection over its limit should stop being read). A hard cap (HARD_CAP_MIB) ends an attack early;
  * RSS after: <= baseline + max(32 MiB, 25 % of baseline, 2 % of the attack's peak growth) once the
    attack's connections are gone and RSS has settled: the server must give back what an attack made it
    take, less some slack for allocator caches and tables that keep their capacity;
  * the server is still up, and its connection count is back to 1 (the stats reader).
"""
import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import time

sys.dont_write_bytecode = True
from sbwire import (ERROR, MESSAGE, PING, REGISTER, ROOM, ROOM_POST, REPLY, connect, error_code, frame, get_stats,
                    method_call, mib, percentile, rss_kib, total_dropped)

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE_CALLS, PROBE_INTERVAL = 300, 0.03
P99_LIMIT_MS = 100.0
HARD_CAP_MIB = 8192
IDLE_CONNS = 10_000
NEVER_READ_CONNS, POST_SIZE, POST_RATE, POSTER_SECONDS = 5_000, 1024, 100, 10
TRICKLERS, TRICKLE_SECONDS, FRAME_LEN = 8, 30, 16 << 20
FLOOD_SECONDS, PING_PAYLOAD = 20, 64
SETTLE_MAX = 15
REG_CAP = 1000  # the server's default --max-registrations
REG_CONNS, REG_TRIES, REG_NAME = 40, 1500, 200
SCRAPE_CONNS, SCRAPE_SECONDS, SCRAPE_LIMIT_MS, SCRAPE_MAX_BYTES = 40, 10, 50.0, 1 << 20
REG_BUDGET = 4  # KiB per channel held


class Attack:
    def __init__(self, args):
        self.port, self.pid, self.limit = args.port, args.pid, args.outbound_limit
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
        socks = await self.open_sockets(IDLE_CONNS)
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

    # ---- 10 and 11: channels held by REGISTER
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
        self.check_cap(10, counts, REG_TRIES)
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
        self.check_cap(11, counts, REG_CAP)
        slowest, largest = max(scrapes, default=0), max(sizes, default=0)
        if not scrapes or percentile(scrapes, 99) >= SCRAPE_LIMIT_MS or largest > SCRAPE_MAX_BYTES:
            reason = (f"attack 11: scrapes ({len(scrapes)}) took {percentile(scrapes, 99):.1f} ms at p99 (limit {SCRAPE_LIMIT_MS:.0f}) "
                      f"and up to {largest} B (limit {SCRAPE_MAX_BYTES})")
            print(f"    FAIL: {reason}", flush=True)
            self.failed.append(reason)
        return (f"{sum(h for h, _ in counts)} channels held; {len(scrapes)} scrapes of /metrics: p50 "
                f"{percentile(scrapes, 50):.1f} ms, p99 {percentile(scrapes, 99):.1f} ms, max {slowest:.1f} ms, up to {largest} B")


async def main_async(args):
    a = Attack(args)
    print(f"server pid {a.pid} port {a.port}, outbound limit {a.limit} B; limits: echo p99 {P99_LIMIT_MS:.0f} ms, "
          f"hard RSS cap {HARD_CAP_MIB} MiB", flush=True)
    plan = [
        (1, "idle", a.idle, IDLE_CONNS * 4),
        (2, "never-read", a.never_read, int(NEVER_READ_CONNS * a.limit / 1024 * 1.25) + 64 * 1024),
        (3, "trickle", a.trickle, 64 * 1024),
        (4, "ping-flood", a.ping_flood, a.limit // 1024 + 64 * 1024),
        (10, "reg-flood", a.registration_flood, REG_CONNS * REG_CAP * REG_BUDGET + 64 * 1024),
        (11, "metrics", a.metrics_scrape, SCRAPE_CONNS * REG_CAP * REG_BUDGET + 64 * 1024),
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
    args = p.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
