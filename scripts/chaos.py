#!/usr/bin/env python3
"""Chaos test of a Switchboard cluster (started by scripts/chaos): random faults under steady load, exact accounting.

It starts nats-server (one, or with --servers 2 two joined by a route), a decoy nats-server kept stopped
(SIGSTOP: it accepts TCP and never says INFO), and NODES nodes `switchboard serve --cluster … --loops 2`
on free loopback ports, each with every nats-server in its --cluster list (its own first). Then, for
MINUTES, under steady load:

  calls      two caller connections per node call `chaos/solo` (a method channel held on n1) and
             `chaos/pair` (held on n2 and n3: a queue group). A holder answers `job(args)` with the
             success envelope of args after 0-300 ms; CANCEL_SHARE of the calls are cancelled.
  broadcasts two posters per node post (poster, seq) to switchboard/room.post; three room listeners
             per node (so both loops have some).
  streams    `chaos/feed`, an event channel held on n1, emits a sequence number every 50 ms while
             listened to; one listener per node.

Faults, one at a time at random times (kinds in FAULTS): kill -9 of a holder's or a caller's node (then
restart), SIGSTOP/SIGCONT of a holder's node, a caller's node or nats-server, a nats-server restart, a
node restarted with the hung decoy first in its --cluster list, a caller reset mid-call (SO_LINGER 0),
and a bus outage (every nats-server killed for a few seconds while posting). Clients of a killed node
reconnect when it is back, and register and listen again.

Rules (PASS/FAIL each; exit 1 on any FAIL):
  one-answer     every call on a connection that stayed up gets exactly one answer (REPLY or ERROR with its
                 id): none pending after a 20 s drain, none duplicated; every answer has a form one node
                 gives (the echo; REPLY of the error envelope `cancelled` for a cancelled call; ERROR
                 `handler_gone`; the null reply when no holder exists);
  answer-kept    no call the holder answered gets handler_gone (or any answer but the holder's) unless the
                 holder's node was killed or stopped, or the bus was down, during the call, or the caller's
                 node was stopped past the lease and the holder answered after it ran out;
  reset-cancel   a caller reset mid-call (SO_LINGER 0): the holder hears CANCEL of each of its calls
                 within 5 s (wire.md: requests of a peer that goes away are cancelled);
  hung-first     a node started with a hung nats-server first in --cluster is connected within 10 s
                 (it goes round the list, cluster.md);
  own-events     a node's listeners get every broadcast made on that node while they listened (cluster.md:
                 even while the bus is down);
  events-counted the events missing at listeners whose node and connection stayed up (broadcasts and the
                 held stream) are no more than the counted losses: per origin node, its eventsUnsent (and
                 any possibly-lost counter) plus every node's eventsDropped, eventsMissed and crossLoop.dropped, compared
                 between one fault's start and the next's (from the stats sampled every 2 s). Events a
                 listener missed while its node's bus was disconnected or rejoining (its log says so) are
                 excused, as cluster.md documents (a node that rejoins gets the events from then on);
  idle           once every client but the holders has left, and again once they have too, every node has
                 0 repliesPending, callsPending and callsServing (cluster and crossLoop);
  rss            each node's RSS, sampled every 10 s in its longest life, the rule of scripts/soak.py.

The summary has the faults by kind (the worst time to an error: from the fault to the last error answer
of a call open when it began; the worst recovery: from its end until every node's calls to each held
channel are answered by a holder and every node's room listeners get a post from every node), the calls and
their answers by kind, the events posted, expected, delivered and missing (excused, at the origin's own
node, not excused against the counted losses), each node's counters summed over its lives, and RSS.
A FAIL's evidence names the calls, listeners and faults; the nodes' logs (with the harness's clock) and
listeners.json (each listener's stream: ends, re-listens, events per origin) stay in the log directory.
"""
import argparse
import asyncio
import ctypes
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
from sbwire import (CANCEL, ERROR, MESSAGE, REGISTER, REPLY, ROOM, ROOM_POST, TYPE_NAMES, Int64, connect,
                    decode_envelope, decode_value, error_code, frame, get_stats, method_call, mib,
                    rss_kib, success)

NODES, LOOPS = 3, 2
SOLO, PAIR, FEED = "chaos/solo", "chaos/pair", "chaos/feed"
HOLDERS = {SOLO: [0], PAIR: [1, 2], FEED: [0]}  # channel -> node indexes of its holders
CALLERS_PER_NODE, CALL_RATE, CALL_DEPTH, CANCEL_SHARE = 2, 8, 8, 0.05  # CALL_RATE per channel per caller
POSTERS_PER_NODE, POST_RATE, LISTENERS_PER_NODE = 2, 8, 3
FEED_PERIOD = 0.05
FAULT_GAP = (6.0, 14.0)  # seconds between the recovery from one fault and the next
RECOVERY_TIMEOUT = 30.0
DRAIN_TIMEOUT = 20.0
MARGIN = 1.5  # seconds: an event is expected only if posted this long after a listen and before the end
LEASE_S = 1.5  # ClusterLink.leaseMs: a node no beacon came from for this long is gone
FAULTS = ["kill_holder_node", "kill_caller_node", "stop_holder_node", "stop_caller_node", "stop_nats",
          "restart_nats", "hung_first", "caller_reset", "bus_outage"]
LOSS_KEYS = ("eventsUnsent",)  # per origin; keys with "ossibl" in any cluster counter are added


def now():
    return time.monotonic()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no child outlives the harness, even after kill -9


def overlaps(a0, a1, b0, b1):
    return a0 <= b1 and b0 <= a1


# ---------------------------------------------------------------- processes

class Proc:
    """A child process whose stderr lines are kept with the time they were read."""
    children = []

    def __init__(self, name, logdir):
        self.name, self.logdir = name, logdir
        self.proc, self.stopped, self.reader, self.lives = None, False, None, 0

    async def spawn(self, argv):
        self.lives += 1
        self.log = open(os.path.join(self.logdir, f"{self.name}.{self.lives}.log"), "w")
        self.proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                         stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        self.stopped = False
        Proc.children.append(self.proc)
        self.reader = asyncio.create_task(self.read_log(self.proc, self.log))

    async def read_log(self, proc, log):
        while True:
            line = await proc.stderr.readline()
            if not line:
                break
            text = line.decode(errors="replace").rstrip()
            log.write(f"{now():.3f} {text}\n")
            log.flush()
            self.on_line(text)
        log.close()

    def on_line(self, text):
        pass

    def signal(self, sig):
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig == signal.SIGCONT:
                self.stopped = False

    async def kill(self):
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.stopped = False

    @property
    def pid(self):
        return self.proc.pid

    @property
    def alive(self):
        return self.proc is not None and self.proc.returncode is None


class NATS(Proc):
    def __init__(self, name, logdir, route_ports=None):
        super().__init__(name, logdir)
        self.port = free_port()
        self.route_ports = route_ports  # (own route port, the other's) or None

    async def start(self):
        argv = ["nats-server", "-a", "127.0.0.1", "-p", str(self.port)]
        if self.route_ports:
            own, other = self.route_ports
            argv += ["--cluster_name", "chaos", "--cluster", f"nats://127.0.0.1:{own}",
                     "--routes", f"nats://127.0.0.1:{other}"]
        await self.spawn(argv)
        for _ in range(200):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start")

    @property
    def url(self):
        return f"nats://127.0.0.1:{self.port}"


class Node(Proc):
    def __init__(self, idx, logdir, binary):
        super().__init__(f"n{idx + 1}", logdir)
        self.idx, self.binary, self.port = idx, binary, free_port()
        self.bus_down = set()  # loops whose bus is disconnected now (from the log)
        self.bus_gaps = []  # [start, end or None] intervals with some loop's bus disconnected
        self.stats = {}  # life -> (first sample, last sample)
        self.rss = {}  # life -> [(t, KiB)]
        self.history = []  # (t, life, flattened stats)

    async def start(self, servers):
        self.bus_down = {str(i) for i in range(LOOPS)}
        if not self.bus_gaps or self.bus_gaps[-1][1] is not None:
            self.bus_gaps.append([now(), None])
        await self.spawn([self.binary, "serve", "--port", str(self.port), "--log-level", "notice", "--loops",
                          str(LOOPS), "--cluster", ",".join(s.url for s in servers), "--node", self.name])

    def on_line(self, text):
        t = now()
        # Each loop logs "cluster bus connected" and "cluster bus lost its connection" (ClusterLink), once
        # per change of its connection's state; other wordings of the same are matched too.
        lost = "cluster bus" in text and any(w in text for w in ("lost", "disconnect", "cannot", "failed"))
        up = "cluster bus" in text and "connected" in text and not lost
        if up or lost:
            loop = text.split("loop=", 1)[1].split()[0] if "loop=" in text else "0"
            was_down = bool(self.bus_down)
            self.bus_down = (self.bus_down - {loop}) if up else (self.bus_down | {loop})
            if was_down and not self.bus_down and self.bus_gaps and self.bus_gaps[-1][1] is None:
                self.bus_gaps[-1][1] = t
            elif not was_down and self.bus_down:
                self.bus_gaps.append([t, None])

    def bus_gap_overlaps(self, t0, t1, settle):
        return any(overlaps(t0, t1, a, (b if b is not None else now()) + settle) for a, b in self.bus_gaps)

    async def kill(self):
        await super().kill()
        self.bus_down = {str(i) for i in range(LOOPS)}
        if not self.bus_gaps or self.bus_gaps[-1][1] is not None:
            self.bus_gaps.append([now(), None])


# ---------------------------------------------------------------- clients

class Conn:
    """One client connection of the harness: its node, when it was up, and its FrameConnection."""

    def __init__(self, harness, role, node):
        self.h, self.role, self.node = harness, role, node
        self.fc, self.t_up, self.t_down = None, None, None

    async def open(self, on_frame=None):
        self.fc = await asyncio.wait_for(connect(self.node.port, on_frame=on_frame, name=f"{self.role}@{self.node.name}"), 2)
        self.t_up = now()
        self.h.conns.append(self)
        self.fc.closed.add_done_callback(lambda _: setattr(self, "t_down", now()))
        return self.fc

    @property
    def stayed_up(self):
        return self.t_down is None


async def run_client(h, role, node, session):
    """Runs `session(conn)` on a fresh connection to `node` again and again until the harness stops:
    a client of a killed node comes back when the node does."""
    while not h.stop:
        conn = Conn(h, role, node)
        try:
            await conn.open()
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.3)
            continue
        try:
            await session(conn)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        if not h.stop:
            if conn.fc.closed.done():
                await asyncio.sleep(0.2)
            else:
                conn.fc.abort()


class Call:
    __slots__ = ("conn", "fid", "channel", "tag", "t_send", "t_cancel", "kind", "payload", "t_ans")

    def __init__(self, conn, fid, channel, tag, t_send):
        self.conn, self.fid, self.channel, self.tag, self.t_send = conn, fid, channel, tag, t_send
        self.t_cancel, self.kind, self.payload, self.t_ans = None, None, None, None


class Harness:
    def __init__(self, args, binary, logdir):
        self.args, self.binary, self.logdir = args, binary, logdir
        self.rng = random.Random(args.seed)
        self.stop = False
        self.conns = []
        self.calls = []
        self.answered_by_holder = {}  # tag -> (t, holder node idx)
        self.holder_got = {}  # tag -> (t, holder node idx)
        self.holder_cancels = {}  # tag -> t
        self.posts = []  # (poster, seq, origin idx, t_send, t_ans or None)
        self.listeners = []  # dicts: conn, kind ('room'|'feed'), t_listen, got {origin: [(seq, t)]}
        self.feed_emitted = []  # (seq, t, node idx)
        self.faults = []  # dicts: kind, target, t0, t1, recovered, notes
        self.failures = []
        self.tag_seq = 0
        self.feed_seq = 0
        self.poster_seq = 0
        self.stats0 = {}

    def fail(self, rule, msg):
        self.failures.append((rule, msg))

    # ---- topology
    async def start_cluster(self):
        if self.args.servers == 2:
            ra, rb = free_port(), free_port()
            self.nats = [NATS("nats-a", self.logdir, (ra, rb)), NATS("nats-b", self.logdir, (rb, ra))]
        else:
            self.nats = [NATS("nats-a", self.logdir)]
        self.decoy = NATS("nats-hung", self.logdir)
        for s in self.nats + [self.decoy]:
            await s.start()
        self.decoy.signal(signal.SIGSTOP)
        self.nodes = [Node(i, self.logdir, self.binary) for i in range(NODES)]
        for n in self.nodes:
            await n.start(self.server_list(n))
        for n in self.nodes:
            await self.wait_ready(n, 20)

    def server_list(self, node, hung_first=False):
        servers = self.nats[node.idx % len(self.nats):] + self.nats[:node.idx % len(self.nats)]
        return ([self.decoy] if hung_first else []) + servers

    async def node_stats(self, node, timeout=2.0):
        return await asyncio.wait_for(get_stats(node.port, timeout), timeout)

    async def pause(self, process, rec, seconds):
        """Stops `process` (SIGSTOP) for `seconds`, then lets it go on; `rec` records it as the fault."""
        rec["target"] = process.name
        rec["t0"] = now()
        process.signal(signal.SIGSTOP)
        await asyncio.sleep(seconds)
        process.signal(signal.SIGCONT)
        rec["t1"] = now()

    async def wait_ready(self, node, timeout):
        """Until the node answers stats with every loop's bus connected; returns the seconds it took or None."""
        t0 = now()
        while now() - t0 < timeout:
            try:
                s = await self.node_stats(node, 1.0)
                if (s.get("cluster") or {}).get("connected"):
                    return now() - t0
            except (OSError, asyncio.TimeoutError, RuntimeError, ConnectionError):
                pass
            await asyncio.sleep(0.1)
        return None

    # ---- holders
    def holder_session(self, channel, node):
        kind = "event" if channel == FEED else "method"

        async def session(conn):
            timers = {}  # holder-side id -> (handle, tag)
            feeding = {"on": False}

            def on_frame(fc, f):
                kind_, flags, fid, ch, payload = f
                if kind_ == MESSAGE and fid != 0 and ch == channel:
                    method, i = decode_value(payload, 0)
                    args, _ = decode_value(payload, i)
                    if channel == FEED:
                        if method == "listen":
                            feeding["on"] = True
                            fc.send(frame(REPLY, fid, "", success(None)))
                        else:
                            feeding["on"] = False
                            fc.send(frame(REPLY, fid, "", success(None)))
                        return
                    tag, hold_ms = args[0], args[1]
                    self.holder_got[tag] = (now(), node.idx)

                    def answer(fid=fid, args=args, tag=tag):
                        timers.pop(fid, None)
                        self.answered_by_holder[tag] = (now(), node.idx)
                        fc.send(frame(REPLY, fid, "", success(args)))
                    timers[fid] = (asyncio.get_running_loop().call_later(hold_ms / 1000.0, answer), tag)
                elif kind_ == CANCEL:
                    entry = timers.pop(fid, None)
                    if entry:
                        entry[0].cancel()
                        self.holder_cancels[entry[1]] = now()

            fc = await conn.open(on_frame) if conn.fc is None else conn.fc
            fc.on_frame_cb = on_frame
            decl = json.dumps({"kind": kind, "codec": "standard"}).encode()
            while not self.stop and not fc.closed.done():
                k, p = await asyncio.wait_for(fc.call(channel, decl, kind=REGISTER), 5)
                if k == REPLY:
                    break
                await asyncio.sleep(0.5)  # channel_taken: the node still has our previous life's registration
            while not self.stop and not fc.closed.done():
                if feeding["on"]:
                    self.feed_seq += 1
                    self.feed_emitted.append((self.feed_seq, now(), node.idx))
                    fc.send(frame(MESSAGE, 0, FEED, success(Int64(self.feed_seq))))
                await asyncio.sleep(FEED_PERIOD if channel == FEED else 0.2)
            for handle, _ in timers.values():
                handle.cancel()
        return session

    # ---- callers
    def caller_session(self, node, idx):
        async def session(conn):
            fc = conn.fc
            window = asyncio.Semaphore(CALL_DEPTH)
            rng = random.Random(self.rng.random())
            loop = asyncio.get_running_loop()
            next_t = loop.time()
            while not self.stop and not fc.closed.done():
                await window.acquire()
                if self.stop or fc.closed.done():
                    break
                channel = SOLO if rng.random() < 0.5 else PAIR
                self.tag_seq += 1
                tag = self.tag_seq
                args = [Int64(tag), rng.randrange(0, 300)]
                fid, fut = fc.request(MESSAGE, channel, method_call("job", args))
                call = Call(conn, fid, channel, tag, now())
                self.calls.append(call)
                if rng.random() < CANCEL_SHARE:
                    delay = rng.random() * 0.3

                    def cancel(call=call):
                        if call.t_ans is None and not fc.closed.done():
                            call.t_cancel = now()
                            fc.send(frame(CANCEL, call.fid))
                    loop.call_later(delay, cancel)

                def done(f, call=call):
                    window.release()
                    if f.cancelled() or f.exception():
                        return
                    call.t_ans = now()
                    call.kind, call.payload = f.result()
                fut.add_done_callback(done)
                next_t += 1.0 / (2 * CALL_RATE)
                delay = next_t - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:
                    next_t = loop.time()
        return session

    # ---- room
    def poster_session(self, node):
        async def session(conn):
            fc = conn.fc
            self.poster_seq += 1
            poster, seq = self.poster_seq, 0  # a poster per connection: a restarted node's posters start again
            while not self.stop and not fc.closed.done():
                seq += 1
                entry = [poster, seq, node.idx, now(), None]
                self.posts.append(entry)
                _, fut = fc.request(MESSAGE, ROOM_POST, struct.pack(">IQ", poster, seq))

                def done(f, entry=entry):
                    if not (f.cancelled() or f.exception()):
                        entry[4] = now()
                fut.add_done_callback(done)
                await asyncio.sleep(1.0 / POST_RATE)
        return session

    def listener_session(self, node, channel):
        async def session(conn):
            fc = conn.fc
            state = {"conn": conn, "channel": channel, "node": node.idx, "t_listen": None, "got": {},
                     "disorder": 0, "ends": [], "errors": []}

            def on_frame(fc_, f):
                kind, flags, fid, ch, payload = f
                if kind != MESSAGE or fid != 0 or ch != channel:
                    return
                t = now()
                if payload is None:
                    state["ends"].append(t)
                    return
                env = decode_envelope(payload)
                if env[0] != "ok":
                    state["errors"].append((t, env[1]))
                    return
                if channel == ROOM:
                    poster, seq = struct.unpack(">IQ", env[1])
                else:
                    poster, seq = "feed", int(env[1])
                got = state["got"].setdefault(poster, [])
                if got and seq <= got[-1][0]:
                    state["disorder"] += 1
                    if state["disorder"] == 1:
                        state["disorder_example"] = (poster, got[-1][0], seq, t)
                got.append((seq, t))
            fc.on_frame_cb = on_frame
            while not self.stop and not fc.closed.done():
                n_ends = len(state["ends"])
                k, p = await asyncio.wait_for(fc.call(channel, method_call("listen", None)), 10)
                if k == REPLY and p is not None and decode_envelope(p)[0] == "ok":
                    if state["t_listen"] is None:
                        state["t_listen"] = now()
                        self.listeners.append(state)
                    else:
                        state.setdefault("relistens", []).append(now())
                    while not self.stop and not fc.closed.done() and len(state["ends"]) == n_ends:
                        await asyncio.sleep(0.2)
                else:
                    await asyncio.sleep(0.5)  # no holder yet (null reply)
        return session

    # ---- stats and RSS
    async def sampler(self):
        last_rss = 0.0
        while not self.stop:
            for n in self.nodes:
                await self.sample_stats(n)
            if now() - last_rss >= 10.0:
                last_rss = now()
                for n in self.nodes:
                    if n.alive:
                        try:
                            n.rss.setdefault(n.lives, []).append((now(), rss_kib(n.pid)))
                        except (OSError, RuntimeError):
                            pass
            await asyncio.sleep(2.0)

    async def sample_stats(self, n):
        if not n.alive or n.stopped:
            return
        try:
            s = await self.node_stats(n, 1.5)
        except (OSError, asyncio.TimeoutError, RuntimeError, ConnectionError):
            return
        first, _ = n.stats.get(n.lives, (s, None))
        n.stats[n.lives] = (first, s)
        n.history.append((now(), n.lives, flatten(s)))

    # ---- faults
    async def restart_node(self, node, hung_first=False):
        await node.start(self.server_list(node, hung_first))

    async def recovered(self, since):
        """Waits until every node is connected and every path works again: a call from every node to
        each held channel answered by its holder, and a post from every node delivered at every node's
        room listeners. Returns the seconds after `since`, or None."""
        deadline = now() + RECOVERY_TIMEOUT
        while now() < deadline:
            ok = True
            for n in self.nodes:
                if not n.alive or n.stopped:
                    ok = False
            if ok:
                t_calls = self.first_success_after(since)
                t_events = self.first_delivery_after(since)
                if t_calls is not None and t_events is not None:
                    return max(t_calls, t_events) - since
            await asyncio.sleep(0.2)
        return None

    def first_success_after(self, since):
        worst = since
        for n in self.nodes:
            for ch in (SOLO, PAIR):
                ts = [c.t_ans for c in reversed(self.calls[-4000:]) if c.t_send > since and c.conn.node is n
                      and c.channel == ch and c.kind == REPLY and c.payload and c.payload[0] == 0]
                if not ts:
                    return None
                worst = max(worst, min(ts))
        return worst

    def first_delivery_after(self, since):
        first_seq = {}  # poster -> (origin, first seq posted after since)
        for poster, seq, origin, t_send, _ in reversed(self.posts[-3000:]):
            if t_send > since:
                first_seq[poster] = (origin, seq)
        worst = since
        for n in self.nodes:
            for origin in range(NODES):
                posters = [p for p, (o, _) in first_seq.items() if o == origin]
                best = None
                for st in self.listeners:
                    if st["node"] != n.idx or st["channel"] != ROOM or st["conn"].t_down is not None:
                        continue
                    for p in posters:
                        for seq, t in st["got"].get(p, [])[-400:]:
                            if seq >= first_seq[p][1]:
                                best = t if best is None else min(best, t)
                                break
                if best is None:
                    return None
                worst = max(worst, best)
        return worst

    async def fault(self, kind):
        rng = self.rng
        rec = {"kind": kind, "target": "", "t0": now(), "t1": None, "note": ""}
        self.faults.append(rec)
        holder_nodes = [self.nodes[i] for i in sorted({i for v in HOLDERS.values() for i in v})]
        if kind == "kill_holder_node" or kind == "kill_caller_node":
            node = rng.choice(holder_nodes if kind == "kill_holder_node" else self.nodes)
            rec["target"] = node.name
            await self.sample_stats(node)
            rec["t0"] = now()
            await node.kill()
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            rec["t1"] = now()
            await self.restart_node(node)
            await self.wait_ready(node, 15)
        elif kind in ("stop_holder_node", "stop_caller_node"):
            node = rng.choice(holder_nodes) if kind == "stop_holder_node" else rng.choice(self.nodes)
            await self.pause(node, rec, rng.uniform(1.0, 5.0))
        elif kind == "stop_nats":
            server = self.nats[0]
            await self.pause(server, rec, rng.uniform(2.0, 6.0))
        elif kind == "restart_nats":
            server = self.nats[0]
            rec["target"] = server.name
            rec["t0"] = now()
            await server.kill()
            await server.start()
            rec["t1"] = now()
        elif kind == "bus_outage":
            rec["target"] = "all nats-servers"
            rec["t0"] = now()
            for s in self.nats:
                await s.kill()
            await asyncio.sleep(rng.uniform(2.0, 4.0))
            for s in self.nats:
                await s.start()
            rec["t1"] = now()
        elif kind == "hung_first":
            node = rng.choice(self.nodes)
            rec["target"] = node.name
            await self.sample_stats(node)
            await node.kill()
            rec["t0"] = now()
            await self.restart_node(node, hung_first=True)
            took = await self.wait_ready(node, 10)
            rec["connect_s"] = took
            if took is None:
                self.fail("hung-first", f"{node.name} started with the hung nats-server first in --cluster was still "
                                        f"not connected after 10 s (issue 28 item 2); restarted without it")
                await self.sample_stats(node)
                await node.kill()
                await self.restart_node(node)
                await self.wait_ready(node, 15)
            rec["t1"] = now()
        elif kind == "caller_reset":
            await self.caller_reset(rec)
        rec["recovery"] = await self.recovered(rec["t1"] or rec["t0"])
        if rec["recovery"] is None:
            rec["note"] += " not recovered within %d s" % RECOVERY_TIMEOUT
        print(f"  {now() - self.t_start:6.1f} s: {kind} {rec['target']}: "
              f"recovered in {rec['recovery'] if rec['recovery'] is None else round(rec['recovery'], 2)} s"
              f"{rec['note']}", flush=True)

    async def caller_reset(self, rec):
        """A caller with calls open at the holder resets its connection (SO_LINGER 0)."""
        holder = self.nodes[HOLDERS[SOLO][0]]
        node = self.rng.choice([n for n in self.nodes if n is not holder])
        rec["target"] = node.name
        fc = await asyncio.wait_for(connect(node.port, name="reset"), 2)
        tags = []
        for _ in range(5):
            self.tag_seq += 1
            tags.append(self.tag_seq)
            _, fut = fc.request(MESSAGE, SOLO, method_call("job", [Int64(self.tag_seq), 60000]))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # the reset fails them: expected
        deadline = now() + 5
        while now() < deadline and not all(t in self.holder_got for t in tags):
            await asyncio.sleep(0.05)
        if not all(t in self.holder_got for t in tags):
            rec["note"] = " (the holder did not get the calls; no reset)"
            fc.abort()
            rec["t1"] = now()
            return
        sock = fc.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rec["t0"] = now()
        fc.transport.abort()
        deadline = now() + 5
        while now() < deadline and not all(t in self.holder_cancels for t in tags):
            await asyncio.sleep(0.05)
        told = [t for t in tags if t in self.holder_cancels]
        rec["t1"] = now()
        rec["cancel_s"] = max((self.holder_cancels[t] - rec["t0"] for t in told), default=None) if len(told) == len(tags) else None
        if len(told) < len(tags):
            self.fail("reset-cancel", f"caller on {node.name} reset with {len(tags)} calls open at the holder on "
                                      f"{holder.name}: the holder heard CANCEL of {len(told)} within 5 s (issue 27 item 14)")
        self.reset_tags = getattr(self, "reset_tags", set()) | set(tags)

    async def injector(self, end):
        kinds = [k for k in FAULTS if k not in self.args.skip]
        while now() < end - 5:
            await asyncio.sleep(self.rng.uniform(*FAULT_GAP))
            if now() >= end - 15:
                break
            await self.fault(self.rng.choice(kinds))

    # ---- the run
    async def run(self):
        await self.start_cluster()
        for n in self.nodes:
            await self.sample_stats(n)
        self.stats0 = {n.idx: n.stats[1][1] for n in self.nodes}
        tasks = []
        for ch, idxs in HOLDERS.items():
            for i in idxs:
                tasks.append(run_client(self, f"holder:{ch}", self.nodes[i], self.holder_session(ch, self.nodes[i])))
        for n in self.nodes:
            for j in range(LISTENERS_PER_NODE):
                tasks.append(run_client(self, "room", n, self.listener_session(n, ROOM)))
            tasks.append(run_client(self, "feed", n, self.listener_session(n, FEED)))
        self.tasks = [asyncio.create_task(t) for t in tasks]
        await asyncio.sleep(2.0)  # holders registered, listeners subscribed everywhere
        self.t_start = now()
        load = []
        for n in self.nodes:
            for j in range(CALLERS_PER_NODE):
                load.append(run_client(self, "caller", n, self.caller_session(n, j)))
            for j in range(POSTERS_PER_NODE):
                load.append(run_client(self, "poster", n, self.poster_session(n)))
        self.tasks += [asyncio.create_task(t) for t in load]
        sampler = asyncio.create_task(self.sampler())
        end = self.t_start + self.args.minutes * 60
        print(f"chaos: {self.args.minutes:g} min, {NODES} nodes x {LOOPS} loops, {len(self.nats)} nats-server(s), "
              f"seed {self.args.seed}, logs in {self.logdir}", flush=True)
        injector = asyncio.create_task(self.injector(end))
        while now() < end:
            await asyncio.sleep(1)
            if injector.done() and injector.exception():
                raise injector.exception()
        await injector
        self.stop = True
        self.t_stop = now()
        drain_end = now() + DRAIN_TIMEOUT
        while now() < drain_end and any(c.fc.pending for c in self.conns if c.stayed_up):
            await asyncio.sleep(0.2)
        await asyncio.sleep(MARGIN)  # the last events arrive
        await asyncio.wait(self.tasks, timeout=5)
        for n in self.nodes:
            await self.sample_stats(n)
        sampler.cancel()

    async def leave_and_check_idle(self):
        """Callers, posters and listeners leave first: nothing may stay open at the holders' nodes (a reset
        caller's calls included); then the holders leave, and nothing at all may stay open."""
        for holders_too in (False, True):
            for c in self.conns:
                if holders_too or not c.role.startswith("holder"):
                    c.fc.close()
            await asyncio.sleep(3)
            for n in self.nodes:
                bad = await self.open_requests(n)
                if bad:
                    self.fail("idle", f"{n.name} after every {'client' if holders_too else 'client but the holders'} "
                                      f"left: {bad}")
        for n in self.nodes:
            try:
                n.rss_after = rss_kib(n.pid)
            except (OSError, RuntimeError):
                n.rss_after = None

    async def open_requests(self, n):
        """The node's counts of requests still open, waiting up to 10 s for them to reach 0: {} when they do."""
        bad = {}
        for _ in range(20):
            try:
                s = await self.node_stats(n)
            except (OSError, asyncio.TimeoutError, RuntimeError, ConnectionError) as e:
                bad = {"stats": str(e)}
                await asyncio.sleep(0.5)
                continue
            cl, cr = s.get("cluster") or {}, s.get("crossLoop") or {}
            left = {"repliesPending": s.get("repliesPending", 0), "cluster.callsPending": cl.get("callsPending", 0),
                    "cluster.callsServing": cl.get("callsServing", 0),
                    "crossLoop.callsPending": cr.get("callsPending", 0),
                    "crossLoop.callsServing": cr.get("callsServing", 0)}
            bad = {k: v for k, v in left.items() if v}
            if not bad:
                return {}
            await asyncio.sleep(0.5)
        return bad

    # ---- accounting
    def check_calls(self):
        c = {"calls": 0, "open_conn_lost": 0, "echo": 0, "cancelled_envelope": 0, "cancelled_error": 0,
             "handler_gone": 0, "null": 0, "other": 0, "pending": 0, "cancels": 0, "reset_probe": 0}
        lost_examples, form_examples, other_examples = [], [], []
        handler_gone_unanswered = {"holder node killed/stopped": 0, "bus down": 0, "queue group member stopped/killed, other alive": 0, "none": 0}
        for call in self.calls:
            c["calls"] += 1
            if call.t_cancel:
                c["cancels"] += 1
            if not call.conn.stayed_up and call.t_ans is None:
                c["open_conn_lost"] += 1
                continue
            if call.t_ans is None:
                c["pending"] += 1
                continue
            kind, payload = call.kind, call.payload
            answered = self.answered_by_holder.get(call.tag)
            if kind == REPLY and payload is not None and payload[0] == 0:
                env = decode_envelope(payload)
                if env[1] and int(env[1][0]) == call.tag:
                    c["echo"] += 1
                    continue
                c["other"] += 1
                other_examples.append(f"{call.channel} tag {call.tag}: echo of {env[1]!r}")
                continue
            if kind == REPLY and payload is not None and decode_envelope(payload)[:2] == ("error", "cancelled"):
                c["cancelled_envelope"] += 1
                if not call.t_cancel:
                    other_examples.append(f"{call.channel} tag {call.tag}: cancelled without a CANCEL")
                continue
            if kind == ERROR and error_code(payload) == "cancelled":
                c["cancelled_error"] += 1
                form_examples.append(f"{call.channel} tag {call.tag} from {call.conn.node.name}: ERROR cancelled "
                                     f"{(call.t_ans - call.t_cancel) if call.t_cancel else 0:.2f} s after its CANCEL")
                continue
            if kind == REPLY and payload is None:
                c["null"] += 1
                reason = "null reply"
            elif kind == ERROR and error_code(payload) == "handler_gone":
                c["handler_gone"] += 1
                reason = "handler_gone"
            else:
                c["other"] += 1
                other_examples.append(f"{call.channel} tag {call.tag}: {TYPE_NAMES.get(kind)} {payload!r:.80}")
                continue
            excuse = self.excuse(call, answered)
            if answered and not call.t_cancel:
                if excuse is None:
                    lost_examples.append(
                        f"{call.channel} tag {call.tag}: caller on {call.conn.node.name}, holder on "
                        f"n{answered[1] + 1} answered {answered[0] - call.t_send:.2f} s after the call; the caller got "
                        f"{reason} {call.t_ans - call.t_send:.2f} s after it"
                        f"{self.during(call.t_send, call.t_ans)}")
            elif reason == "handler_gone" and not answered:
                handler_gone_unanswered[self.unanswered_reason(call)] += 1
        self.call_counts = c
        self.handler_gone_unanswered = handler_gone_unanswered
        if c["pending"]:
            ex = [f"{x.channel} tag {x.tag} on {x.conn.node.name}" for x in self.calls if x.conn.stayed_up and x.t_ans is None][:5]
            self.fail("one-answer", f"{c['pending']} call(s) never answered on connections that stayed up, e.g. {ex}")
        dup = [(x.fc.name, x.fc.unexpected[:3]) for x in self.conns if x.fc.unexpected]
        if dup:
            self.fail("one-answer", f"{sum(len(x.fc.unexpected) for x in self.conns)} duplicate or unmatched answer(s): {dup[:3]}")
        if c["other"]:
            self.fail("one-answer", f"{c['other']} answer(s) of a form one node never gives: {other_examples[:5]}")
        if c["cancelled_error"]:
            self.fail("one-answer", f"{c['cancelled_error']} cancelled call(s) answered ERROR cancelled, where one node "
                                    f"answers the method channel's error envelope (issue 28 item 4), e.g. {form_examples[:3]}")
        if lost_examples:
            self.fail("answer-kept", f"{len(lost_examples)} call(s) the holder answered got another answer while both "
                                     f"nodes were alive and the holder's node and the bus ran: " + "; ".join(lost_examples[:6]))

    def during(self, t0, t1):
        hits = [f"{f['kind']} {f['target']}" for f in self.faults if overlaps(t0, t1, f["t0"] - 1, (f["t1"] or f["t0"]) + 2)]
        return f" (during {', '.join(hits)})" if hits else " (no fault near it)"

    def fault_windows(self, kinds, target=None):
        for f in self.faults:
            if f["kind"] in kinds and (target is None or f["target"] == target):
                yield f["t0"], (f["t1"] or now())

    def excuse(self, call, answered):
        """Why cluster.md lets this call's answer be lost, or None: the holder's node was killed or stopped
        during the call, the caller's node was stopped past the lease before the holder answered, or (for
        a call across nodes) the bus was down."""
        holder = f"n{answered[1] + 1}" if answered else None
        for f in self.faults:
            if not overlaps(call.t_send, call.t_ans, f["t0"], (f["t1"] or now()) + 2):
                continue
            if f["kind"] in ("kill_holder_node", "kill_caller_node", "hung_first", "stop_holder_node") \
                    and f["target"] == holder:
                return f["kind"]
            if f["kind"] == "stop_caller_node" and f["target"] == holder:
                return f["kind"]  # the node stopped held the channel (a caller's node may be a holder's too)
            if f["kind"] in ("stop_holder_node", "stop_caller_node") and f["target"] == call.conn.node.name \
                    and answered and f["t1"] and f["t1"] - f["t0"] > LEASE_S and answered[0] > f["t0"] + LEASE_S:
                # The caller's node was stopped past the lease and the holder answered after it ran out:
                # the holder's node took it for gone and ended its open calls (cluster.md, Beacons).
                return "caller's node stopped past the lease"
            if f["kind"] in ("stop_nats", "restart_nats", "bus_outage") and holder != call.conn.node.name:
                return "bus down"
        return None

    def unanswered_reason(self, call):
        t0, t1 = call.t_send, call.t_ans
        hits = [f for f in self.faults if overlaps(t0, t1, f["t0"], (f["t1"] or now()) + 2)]
        holders = {f"n{i + 1}" for i in HOLDERS[call.channel]}
        for f in hits:
            if f["kind"] in ("stop_nats", "restart_nats", "bus_outage"):
                return "bus down"
        for f in hits:
            if f["target"] in holders:
                return ("queue group member stopped/killed, other alive" if len(holders) > 1
                        else "holder node killed/stopped")
        return "none"

    def check_events(self):
        # posts by (poster, seq): origin and times; only answered posts count as broadcast
        posts = {(p, s): (o, t0, t1) for p, s, o, t0, t1 in self.posts if t1 is not None}
        feed = {("feed", s): (o, t, t) for s, t, o in self.feed_emitted}
        kills = {i: [(a, b) for a, b in self.fault_windows(("kill_holder_node", "kill_caller_node", "hung_first"), f"n{i + 1}")]
                 for i in range(NODES)}
        stops = {i: [(a, b) for a, b in self.fault_windows(("stop_holder_node", "stop_caller_node"), f"n{i + 1}")]
                 for i in range(NODES)}
        missed = {i: set() for i in range(NODES)}  # origin -> missed (poster, seq) not excused
        missed_by = {}  # (poster, seq) -> listeners that missed it
        excused = 0
        own_missed = []
        per_listener_missing = 0
        delivered = 0
        expected_total = 0
        for st in self.listeners:
            conn, n = st["conn"], st["node"]
            lo = st["t_listen"] + MARGIN
            hi = (conn.t_down if conn.t_down is not None else self.t_stop) - MARGIN
            source = posts if st["channel"] == ROOM else feed
            got = {(p, s) for p, lst in st["got"].items() for s, _ in lst}
            delivered += sum(len(v) for v in st["got"].values())
            if st["disorder"]:
                p, prev, seq, t = st["disorder_example"]
                self.fail("events-counted", f"listener {conn.fc.name}: {st['disorder']} event(s) out of order or "
                                            f"duplicated, first ({p}, {seq}) after ({p}, {prev}){self.during(t - 3, t)}")
            # a feed stream's gaps: from its end (handler_gone) until the next listen's answer
            gaps = []
            if st["channel"] == FEED:
                relistens = st.get("relistens", [])
                for e in st["ends"]:
                    nxt = min((r for r in relistens if r > e), default=now())
                    gaps.append((e - MARGIN, nxt + MARGIN))
            for key, (origin, t0, t1) in source.items():
                if not (lo <= t0 and t1 <= hi):
                    continue
                if any(overlaps(t0, t1, a, b) for a, b in gaps):
                    continue
                if any(overlaps(t0 - MARGIN, t1 + MARGIN, a, b) for a, b in kills[origin]):
                    continue  # the origin died around it: its publish may not have left
                expected_total += 1
                if key in got:
                    continue
                per_listener_missing += 1
                if origin == n and st["channel"] == ROOM:
                    own_missed.append((conn.fc.name, key, t0))
                    continue
                node = self.nodes[n]
                if node.bus_gap_overlaps(t0, t1, MARGIN) or any(overlaps(t0, t1, a, b + MARGIN) for a, b in stops[n]) \
                        or any(overlaps(t0, t1, a, b + MARGIN) for a, b in stops[origin]):
                    excused += 1
                    continue
                missed[origin].add(key)
                missed_by.setdefault(key, []).append(f"{conn.fc.name}#{id(conn) % 1000}")
        with open(os.path.join(self.logdir, "listeners.json"), "w") as out:  # evidence for a FAIL
            rel = lambda t: None if t is None else round(t - self.t_start, 2)
            json.dump([{"name": st["conn"].fc.name, "id": id(st["conn"]) % 1000, "listen": rel(st["t_listen"]),
                        "down": rel(st["conn"].t_down), "ends": [rel(t) for t in st["ends"]],
                        "errors": [(rel(t), e) for t, e in st["errors"]],
                        "relistens": [rel(t) for t in st.get("relistens", [])],
                        "got": {str(p): [len(v), rel(v[0][1]), rel(v[-1][1])] for p, v in st["got"].items()}}
                       for st in self.listeners], out, indent=1)
        counted, counters = self.loss_counters()
        self.event_figures = dict(posted=len(posts), emitted=len(feed), expected=expected_total, delivered=delivered,
                                  missing=per_listener_missing, excused=excused, own_missed=len(own_missed),
                                  missed_distinct={i: len(v) for i, v in missed.items()}, counted=counted,
                                  counters=counters)
        if own_missed:
            ex = [f"{name} missed ({k[0]}, {k[1]}){self.during(t, t)}" for name, k, t in own_missed[:4]]
            self.fail("own-events", f"{len(own_missed)} broadcast(s) missed by a listener of the node that made them "
                                    f"(issue 28 item 3 when during a bus outage), e.g. {ex}")
        # Compared fault by fault: the run is cut before each fault, so that losses counted in one fault
        # cannot hide losses nobody counted in another.
        cuts = [self.t_start - 10] + [f["t0"] - 1 for f in self.faults] + [now()]
        for a, b in zip(cuts, cuts[1:]):
            in_segment = self.counted_between(a, b)
            for origin, keys in missed.items():
                seg = [k for k in keys if a <= (posts.get(k) or feed.get(k))[1] < b]
                if len(seg) > in_segment[origin]:
                    when = sorted((posts.get(k) or feed.get(k))[1] for k in seg)
                    names = {}
                    for k in seg:
                        for name in missed_by[k]:
                            names[name] = names.get(name, 0) + 1
                    self.fail("events-counted", f"events from n{origin + 1} missed at listeners whose node and bus "
                                                f"stayed up: {len(seg)} distinct, but the losses counted meanwhile "
                                                f"({a - self.t_start:.0f}-{b - self.t_start:.0f} s) are "
                                                f"{in_segment[origin]}; missed at {self.cluster_times(when)}; "
                                                f"by listener: {names}")

    def cluster_times(self, times):
        """Groups times into runs (gap > 1 s starts a new one), each with the fault near it."""
        runs = []
        for t in times:
            if runs and t - runs[-1][1] <= 1.0:
                runs[-1][1] = t
                runs[-1][2] += 1
            else:
                runs.append([t, t, 1])
        out = []
        for a, b, k in runs[:6]:
            out.append(f"{k} in {a - self.t_start:.1f}-{b - self.t_start:.1f} s{self.during(a, b)}")
        return "; ".join(out) + (f"; … {len(runs) - 6} more runs" if len(runs) > 6 else "")

    def counted_between(self, a, b):
        """Per origin node: the losses counted from time a to b (its eventsUnsent and possibly-lost
        counters, and every node's receiving-side drops), from the samples around a and b of each life."""
        per_node = {}
        for n in self.nodes:
            tot = {}
            for life in {lf for _, lf, _ in n.history}:
                samples = [(t, flat) for t, lf, flat in n.history if lf == life]
                before = [flat for t, flat in samples if t <= a]
                after = [flat for t, flat in samples if t >= b]
                if samples[-1][0] <= a:
                    continue  # this life ended before the segment
                start = before[-1] if before else {}
                end = after[0] if after else samples[-1][1]
                for k, v in end.items():
                    tot[k] = tot.get(k, 0) + v - start.get(k, 0)
            per_node[n.idx] = tot
        return self.sum_losses(per_node)

    def sum_losses(self, per_node):
        possibly = sorted({k for t in per_node.values() for k in t if "ossibl" in k})
        receiving = sum(v for t in per_node.values() for k, v in t.items()
                        if k.startswith("eventsDropped.") or k in ("crossLoop.dropped", "cluster.eventsMissed"))
        return {i: sum(t.get(f"cluster.{k}", 0) for k in LOSS_KEYS) + sum(t.get(k, 0) for k in possibly) + receiving
                for i, t in per_node.items()}

    def loss_counters(self):
        """Per origin node: its counted losses of events it made, plus every node's receiving-side drops."""
        per_node = {}
        keys_seen = set()
        for n in self.nodes:
            tot = {}
            for life, (first, last) in n.stats.items():
                base = self.stats0[n.idx] if life == 1 else {}
                for k, v in flatten(last).items():
                    tot[k] = tot.get(k, 0) + v - flatten(base).get(k, 0)
            per_node[n.idx] = tot
            keys_seen |= set(tot)
        possibly = sorted(k for k in keys_seen if "ossibl" in k)
        counted = self.sum_losses(per_node)
        show = ["cluster.eventsOut", "cluster.eventsIn", "cluster.eventsUnsent", "cluster.busDropped",
                "cluster.busReconnects", "cluster.callsExpired", "cluster.callsNoHolder", "cluster.stalls",
                "cluster.nodesLost", "cluster.eventsMissed", "crossLoop.dropped"] + possibly
        counters = {f"n{i + 1}": {k.split(".", 1)[-1]: t.get(k, 0) for k in show}
                    | {"eventsDropped": sum(v for k, v in t.items() if k.startswith("eventsDropped."))}
                    for i, t in per_node.items()}
        return counted, counters

    def check_rss(self):
        rows = []
        for n in self.nodes:
            life, samples = max(n.rss.items(), key=lambda kv: len(kv[1]), default=(0, []))
            ks = [k for _, k in samples]
            third = len(ks) // 3
            verdict = "skipped (fewer than 6 samples)"
            if len(ks) >= 6:
                mid, last = ks[third:2 * third], ks[2 * third:]
                m_mid, m_last = sum(mid) / len(mid), sum(last) / len(last)
                growth = m_last - m_mid
                verdict = f"last third {mib(m_last):.1f} vs middle {mib(m_mid):.1f} MiB: {mib(growth):+.1f}"
                if growth > 0.10 * m_mid and growth > 8 * 1024:
                    self.fail("rss", f"{n.name}: RSS grew after warm-up: {verdict} (limit +10 % and +8 MiB)")
                    verdict += " FAIL"
                else:
                    verdict += " ok"
            rng_ = f"{mib(min(ks)):.1f}-{mib(max(ks)):.1f} MiB" if ks else "-"
            after = f"{mib(n.rss_after):.1f}" if getattr(n, "rss_after", None) else "-"
            rows.append((f"RSS {n.name} (life {life} of {n.lives}, {len(ks)} samples)",
                         f"{rng_}, after the clients left {after} MiB; {verdict}"))
        return rows

    def fault_rows(self):
        rows = []
        by_kind = {}
        for f in self.faults:
            by_kind.setdefault(f["kind"], []).append(f)
        for kind in FAULTS:
            fs = by_kind.get(kind, [])
            if not fs:
                continue
            # time to an error: the calls open when the fault began that were answered with an error
            worst_err = None
            for f in fs:
                for call in self.calls:
                    if call.t_send <= f["t0"] and call.t_ans is not None and call.t_ans >= f["t0"] \
                            and not (call.kind == REPLY and call.payload and call.payload[0] == 0):
                        d = call.t_ans - f["t0"]
                        worst_err = d if worst_err is None else max(worst_err, d)
            recs = [f["recovery"] for f in fs if f.get("recovery") is not None]
            unrec = sum(1 for f in fs if f.get("recovery") is None)
            extra = ""
            if kind == "hung_first":
                cs = [f.get("connect_s") for f in fs]
                extra = "; connected in " + ", ".join("never" if c is None else f"{c:.2f} s" for c in cs)
            if kind == "caller_reset":
                cs = [f.get("cancel_s") for f in fs]
                extra = "; holder told in " + ", ".join("never" if c is None else f"{c:.2f} s" for c in cs)
            rows.append((f"fault {kind} x{len(fs)}",
                         f"targets {','.join(sorted({f['target'] for f in fs}))}; worst time to an error "
                         f"{'-' if worst_err is None else f'{worst_err:.2f} s'}; worst recovery "
                         f"{'-' if not recs else f'{max(recs):.2f} s'}" + (f" ({unrec} not recovered)" if unrec else "")
                         + extra))
        return rows


def flatten(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, bool):
            continue
        elif isinstance(v, (int, float)):
            out[key] = v
    return out


async def stop_children():
    for child in Proc.children:
        if child.returncode is None:
            try:
                child.send_signal(signal.SIGCONT)
                child.kill()
            except ProcessLookupError:
                pass
            await child.wait()


async def main_async(args, binary):
    logdir = tempfile.mkdtemp(prefix="chaos.")
    h = Harness(args, binary, logdir)
    try:
        await asyncio.wait_for(h.run(), args.minutes * 60 + 300)
        await h.leave_and_check_idle()
    except Exception as e:
        import traceback
        traceback.print_exc()
        print(f"chaos: FAIL: {type(e).__name__}: {e} (logs in {logdir})")
        return 1
    finally:
        h.stop = True
        await stop_children()
    h.check_calls()
    h.check_events()
    rss_rows = h.check_rss()
    c, ef = h.call_counts, h.event_figures
    rows = [("faults injected", ", ".join(f"{k} {sum(1 for f in h.faults if f['kind'] == k)}" for k in FAULTS
                                          if any(f["kind"] == k for f in h.faults)) or "none")]
    rows += h.fault_rows()
    rows += [
        ("calls", f"{c['calls']} made ({c['cancels']} cancelled), {c['open_conn_lost']} open when their caller's "
                  f"connection went (not counted)"),
        ("answers", f"echo {c['echo']}, cancelled envelope {c['cancelled_envelope']}, ERROR cancelled "
                    f"{c['cancelled_error']}, handler_gone {c['handler_gone']}, null reply {c['null']}, other "
                    f"{c['other']}, never answered {c['pending']}"),
        ("handler_gone, holder never answered", ", ".join(f"{k}: {v}" for k, v in h.handler_gone_unanswered.items())),
        ("events", f"{ef['posted']} broadcasts posted, {ef['emitted']} stream events emitted; {ef['expected']} "
                   f"expected at listeners, {ef['delivered']} delivered, {ef['missing']} missing ({ef['excused']} "
                   f"excused: listener's bus rejoining or a node stopped; {ef['own_missed']} at the origin's own node)"),
        ("events missed, not excused", ", ".join(f"from n{i + 1}: {v} (counted {ef['counted'][i]})"
                                                 for i, v in ef["missed_distinct"].items())),
    ]
    for name, cs in ef["counters"].items():
        rows.append((f"counters {name}", ", ".join(f"{k} {v}" for k, v in cs.items())))
    rows += rss_rows
    rows.append(("logs", logdir))
    width = max(len(r[0]) for r in rows)
    print("\nchaos summary")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    rules = ["one-answer", "answer-kept", "reset-cancel", "hung-first", "own-events", "events-counted", "idle", "rss"]
    print()
    exercised = {"reset-cancel": "caller_reset", "hung-first": "hung_first"}
    for rule in rules:
        fails = [m for r, m in h.failures if r == rule]
        idle = rule in exercised and not any(f["kind"] == exercised[rule] for f in h.faults)
        print(f"  {'FAIL' if fails else 'PASS'}  {rule}{' (not exercised: no such fault in this run)' if idle else ''}")
        for m in fails[:10]:
            print(f"        - {m}")
    print(f"\nchaos: {'FAIL' if h.failures else 'PASS'}")
    return 1 if h.failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, help="the switchboard executable")
    p.add_argument("--minutes", type=float, default=5)
    p.add_argument("--servers", type=int, choices=(1, 2), default=1, help="nats-servers (2: joined by a route)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--skip", action="append", default=[], choices=FAULTS, help="a fault kind not to inject")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)

    def on_signal(sig, _):
        for child in Proc.children:
            try:
                child.send_signal(signal.SIGCONT)
                child.kill()
            except ProcessLookupError:
                pass
        sys.exit(130 if sig == signal.SIGINT else 143)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    status = 1
    try:
        status = asyncio.run(main_async(args, args.binary))
    finally:
        for child in Proc.children:
            try:
                child.send_signal(signal.SIGCONT)
                child.kill()
            except ProcessLookupError:
                pass
    sys.exit(status)


if __name__ == "__main__":
    main()
