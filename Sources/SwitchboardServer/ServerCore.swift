#if canImport(Glibc)
import Glibc
#endif
import Logging
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardTransport
import SwitchboardWire

/// What a request carries into the router.
enum RouteInput: Sendable {
    /// A binary MESSAGE payload, in the channel's codec: a slice of the connection's inbound buffer,
    /// valid while the request is being routed (copied by whatever keeps it).
    case bytes(ArraySlice<UInt8>?)
    /// A text-mode call, listen or cancel.
    case call(MethodCall)
    /// A text-mode send.
    case message(ChannelValue)
}

/// Server-wide counters, read by `switchboard/stats`. Plain integers only: updating one then never
/// releases anything, so the compiler can prove the updates exclusive and check none of them at run
/// time (the per-reason tallies live in ``ServerCore/tallies``).
struct Counters {
    var framesIn = 0, framesOut = 0, bytesIn = 0, bytesOut = 0
    var repliesPending = 0
    var slowConsumersClosed = 0
    /// REPLY or CANCEL frames matching nothing pending.
    var ignoredFrames = 0
    var connectionsTotal = 0
    /// Requests forwarded to clients holding channels.
    var forwardedRequests = 0
    /// Connections that could not be accepted (such as EMFILE: out of file descriptors).
    var acceptErrors = 0
    /// REGISTERs refused because their connection held ``ServerConfiguration/maxRegistrationsPerConnection``.
    var registrationsRefused = 0
    /// Requests refused because their connection had ``ServerConfiguration/maxOpenRequests`` open.
    var openRequestsRefused = 0
    /// DEMANDs before a listen that were not kept: their connection kept credit for as many channel
    /// names as it may (``Connection/pendingCreditLimit``).
    var demandsIgnored = 0
    /// The requests and events of channels that are gone (their ``ChannelCounts`` went with them), so
    /// that the totals in stats never go down.
    var goneChannelRequests = 0, goneChannelEvents = 0
}

/// Counts by reason, read by `switchboard/stats`.
struct Tallies {
    var eventsDropped: [String: Int] = [:]
    var closes: [String: Int] = [:]
    /// By plugin, then by code.
    var pluginRejections: [String: [String: Int]] = [:]
    var pluginFailures: [String: Int] = [:]
}

/// The loop-owned heart of the server: connections, channels, limits, stats and shutdown.
final class ServerCore {
    enum Phase { case running, draining, closing, stopped }

    let config: ServerConfiguration
    let eventLoop: EventLoop
    var handle: LoopHandle { eventLoop.handle }
    let logger: Logger
    var stats = Counters()
    /// The loaded plugins.
    let pipeline = Pipeline()
    var tallies = Tallies()
    private(set) var phase = Phase.running
    var isDraining: Bool { phase != .running }
    private var listener: TCPListener?
    private var tlsListener: TCPListener?
    private(set) var connections: [UInt64: Connection] = [:]
    private var closingConnections: [Connection] = []
    /// Connections accepted by this loop so far: the ids are dealt round the loops (loop `i` of `n`
    /// gives `i + 1`, `i + 1 + n`, …), so that an id tells its loop.
    private var connectionsMade: UInt64 = 0
    /// This loop's place among the server's loops, and how many there are.
    let index: Int
    let loopCount: Int
    /// The server's loops; nil once released.
    var group: LoopGroup?
    /// The loop the next accepted connection goes to (loop 0, which accepts for all).
    private var nextLoop = 0
    /// Where channel names lead on this loop: the served channels, the held ones, the streams from elsewhere.
    let directory = ChannelDirectory()
    /// ``Pipeline/gateEpoch`` when this loop's registrations and streams were last judged (Revocation.swift).
    var holdingsJudgedAt = 0
    /// The held channels with a metrics label of their own: at most `--metrics-channels` on each loop.
    var labeledHeld: Set<String> = []
    let heldCounts = HeldCounts()
    /// The connection that last made output this turn, first of a list linked through
    /// `OutboundBuffer.nextDirty`: all are flushed once, just before the loop blocks. A list rather than an
    /// array, so that marking a connection is two plain stores.
    var firstDirty: Connection?
    private var beforeSleep: BeforeSleep?
    private var housekeeping: Timer?
    /// A zero-delay timer that keeps the loop from blocking while work is ready (see ``kickLoop()``).
    private var kick: Timer?
    /// The last accept error logged, so a storm of them logs once a second, not once per attempt.
    private var lastAcceptErrorLog: UInt64 = 0
    /// Memory freed at once since free memory was last given back to the kernel: the output closed
    /// connections held, and the channels clients let go (``Registration/footprint`` each).
    var releasedSinceTrim = 0
    private var lastTrim: UInt64 = 0
    private var shutdownTimer: Timer?
    /// Whether this loop told the others that its drain is over.
    private var reportedDrained = false
    /// Snapshots of this loop's counts taken for the metrics reporter.
    var metricsSnapshots: UInt64 = 0
    private var signalWatchers: [SignalWatcher] = []
    let startedAt: UInt64
    private var metricsTimer: Timer?
    var connectionCount: Int { connections.count }
    /// Where work goes that this loop cannot do (``Elsewhere``), once bound: the other loops of this
    /// server (with several), then the other nodes (``ServerConfiguration/cluster``).
    private(set) var siblings: SiblingLoops?
    private(set) var cluster: ClusterLink?
    /// The caps on connections, shared by the server's loops.
    let quota: ConnectionQuota
    /// The resumable sessions made on this loop (protocol/resumption.md).
    let sessions: SessionTable
    /// The last refusal logged (see ``lastAcceptErrorLog``).
    private var lastRefusalLog: UInt64 = 0

    init(config: ServerConfiguration, logger: Logger, index: Int = 0, loops: Int = 1, quota: ConnectionQuota) throws(UVError) {
        self.config = config
        self.quota = quota
        sessions = SessionTable(limit: config.maxParkedSessions / max(1, loops), ttlMs: config.sessionTTLMs)  // each loop its share
        self.logger = logger
        self.index = index
        loopCount = loops
        eventLoop = try EventLoop()
        startedAt = eventLoop.now
    }

    // MARK: Lifecycle

    /// Binds the listeners (loop 0 accepts for every loop) and starts serving; returns the port.
    func bind() throws(UVError) -> Int {
        let listener = try TCPListener(loop: eventLoop, host: config.host, port: config.port) { [unowned self] transport in
            accepted(transport, tls: nil)
        }
        listener.onAcceptError = { [unowned self] error in acceptFailed(error) }
        self.listener = listener
        if let tls = config.tls {
            let tlsListener = try TCPListener(loop: eventLoop, host: config.host, port: tls.port) { [unowned self] transport in
                accepted(transport, tls: tls)
            }
            tlsListener.onAcceptError = { [unowned self] error in acceptFailed(error) }
            self.tlsListener = tlsListener
        }
        try startServing()
        return listener.port
    }

    /// Starts the per-turn work, and the ways to the other loops and nodes.
    func startServing() throws(UVError) {
        try startPerTurnWork()
        if let group, group.count > 1 {
            let siblings = SiblingLoops(index: index, group: group)
            connect(siblings)
            siblings.onDropped = { [unowned self] in self.cluster?.loopEventsDropped += 1 }
            self.siblings = siblings
        }
        guard let settings = config.cluster else { return }
        let cluster = try ClusterLink(settings: settings, loop: loopCount > 1 ? index : nil, process: group?.process ?? "",
                                      eventLoop: eventLoop, logger: logger)
        connect(cluster)
        cluster.onPeerLost = { [unowned self] node in peerLost(node) }
        cluster.listenersToReport = { [unowned self] in
            directory.remoteStreams.values.filter { !SiblingLoops.isLoop($0.holderNode) }.map { ($0.holderNode, $0.entry.name, $0.entry.listeners.all.count) }
        }
        cluster.onListenerReport = { [unowned self] node, counts in reconcileListeners(of: node, counts) }
        cluster.start()
        self.cluster = cluster
    }

    /// Takes what comes from `elsewhere`: events, and calls for the holders here.
    private func connect(_ elsewhere: some Elsewhere) {
        elsewhere.onEvent = { [unowned self] channel, envelope, frame, holderNode in
            deliverRemote(on: channel, envelope: envelope, frame: frame, holderNode: holderNode)
        }
        elsewhere.onCalls = { [unowned self, unowned elsewhere] channel, calls in serveRemote(calls, on: channel, via: elsewhere) }
        elsewhere.onServedAnswered = { [unowned self] in requestFinished() }
    }

    /// A connection loop 0 accepted: served here, or handed to the loop whose turn it is.
    /// Admitted by the connection caps, it is counted under its host until it closes; refused, it is
    /// closed at once (it has no mode yet to be told in), counted and logged.
    private func accepted(_ transport: TCPConnection, tls: TLSSettings?) {
        let host = hostOfAddress(transport.remoteAddress)
        let (refusal, toResume) = quota.admit(host)
        if let refusal { return refuse(transport, refusal, host: host) }
        let target = nextLoop
        nextLoop = (nextLoop + 1) % loopCount
        guard target != index, let sibling = group?.cores[target] else { return serve(transport, tls: tls, host: host, toResume: toResume) }
        let socket: DetachedSocket
        do { socket = try transport.detach() } catch {
            quota.release(host)
            return acceptFailed(error)
        }
        let quota = quota
        if !sibling.loop.execute({ sibling.value.adopt(socket, tls: tls, host: host, toResume: toResume) }) {
            quota.release(host)
            socket.close()
        }
    }

    private func refuse(_ transport: TCPConnection, _ refusal: ConnectionQuota.Refusal, host: String) {
        tallies.closes[refusal.rawValue, default: 0] += 1
        transport.closeNow()
        let now = eventLoop.now
        guard now - lastRefusalLog >= 1000 || lastRefusalLog == 0 else { return }
        lastRefusalLog = now
        logger.warning("refusing connections: \(refusal.rawValue)", metadata: [
            "remote": "\(host)", "maxConnections": "\(quota.maxConnections)", "maxConnectionsPerAddress": "\(quota.maxPerAddress)"])
    }

    /// Serves a connection loop 0 accepted for this loop (`toResume`: past its address's cap, to resume).
    private func adopt(_ socket: DetachedSocket, tls: TLSSettings?, host: String, toResume: Bool) {
        guard phase == .running || phase == .draining else {
            quota.release(host)
            return socket.close()
        }
        let transport: TCPConnection
        do { transport = try TCPConnection.adopt(socket, loop: eventLoop) } catch {
            quota.release(host)
            return acceptFailed(error)
        }
        serve(transport, tls: tls, host: host, toResume: toResume)
    }

    /// Serves a connection whose resuming HELLO another loop read, for a session of this loop: `input`
    /// (the HELLO and what followed it) is read first, as the connection's own.
    func adoptResuming(_ connection: DetachedConnection, host: String?, toResume: Bool, input: [UInt8]) {
        guard phase == .running || phase == .draining else {
            if let host { quota.release(host) }
            return connection.close()
        }
        let transport: HTTPUpgradeTransport
        // Past its first bytes, the connection answers no HTTP request: no endpoint is needed.
        let options = HTTPUpgradeTransport.Options(maxFrame: Int(config.maxFrame), allowedOrigins: config.webSocketOrigins)
        do { transport = try HTTPUpgradeTransport(adopting: connection, loop: eventLoop, options: options) } catch {
            if let host { quota.release(host) }
            return acceptFailed(error)
        }
        accept(transport, admittedHost: host, toResume: toResume)?.handle(.data(input))
    }

    /// Serves an accepted TCP connection, under TLS when it came to the TLS port.
    private func serve(_ transport: TCPConnection, tls: TLSSettings?, host: String, toResume: Bool) {
        if let tls { return acceptTLS(transport, tls, host: host, toResume: toResume) }
        accept(web(transport), admittedHost: host, toResume: toResume)
    }

    /// The TLS port, once bound.
    var tlsPort: Int? { tlsListener?.port }

    private func acceptTLS(_ transport: any Transport, _ tls: TLSSettings, host: String, toResume: Bool) {
        do {
            accept(web(try TLSTransport(over: transport, context: tls.context, loop: eventLoop, handshakeTimeoutMs: tls.handshakeTimeoutMs)),
                   admittedHost: host, toResume: toResume)
        } catch {
            logger.warning("cannot start TLS: \(error)")
            quota.release(host)
            transport.closeNow()
        }
    }

    /// `transport`, also answering HTTP and WebSocket upgrades (wire-v1 section 8).
    private func web(_ transport: any Transport) -> HTTPUpgradeTransport {
        let peer = transport.remoteAddress
        let options = HTTPUpgradeTransport.Options(maxFrame: Int(config.maxFrame), allowedOrigins: config.webSocketOrigins) {
            [unowned self] request, answer in config.httpEndpoints ? respond(to: request, from: peer, answer) : answer(nil)
        }
        return HTTPUpgradeTransport(over: transport, options: options)
    }

    /// Starts the per-turn flush, the kick timer and the housekeeping timer.
    func startPerTurnWork() throws(UVError) {
        beforeSleep = try BeforeSleep(loop: eventLoop) { [unowned self] in flushDirty() }
        kick = try Timer(loop: eventLoop)
        let housekeeping = try Timer(loop: eventLoop)
        let periods = [config.heartbeatMs, config.firstFrameTimeoutMs, config.frameTimeoutMs].filter { $0 > 0 }
        let interval = max(10, min(100, config.slowConsumerGraceMs / 4, periods.map { $0 / 4 }.min() ?? 100))
        housekeeping.start(after: interval, repeat: interval) { [unowned self] in keepHouse() }
        self.housekeeping = housekeeping
        // Reported when scraped, or by loop 0's timer for every loop.
        guard config.metrics.exposition == nil, index == 0 else { return }
        let metricsTimer = try Timer(loop: eventLoop)
        metricsTimer.start(after: config.metrics.intervalMs, repeat: config.metrics.intervalMs) { [unowned self] in
            reportMetrics {}
        }
        self.metricsTimer = metricsTimer
    }

    private func acceptFailed(_ error: UVError) {
        stats.acceptErrors += 1
        let now = eventLoop.now
        guard now - lastAcceptErrorLog >= 1000 || lastAcceptErrorLog == 0 else { return }
        lastAcceptErrorLog = now
        logger.warning("cannot accept connections: \(error)", metadata: ["acceptErrors": "\(stats.acceptErrors)"])
    }

    /// Stops gracefully on SIGINT or SIGTERM; a second signal stops at once.
    func handleSignals() throws(UVError) {
        for signal in [SIGINT, SIGTERM] {
            signalWatchers.append(try SignalWatcher(loop: eventLoop, signal: signal) { [unowned self] in
                let first = phase == .running
                for core in group?.cores ?? [] { core.onLoop { first ? $0.beginShutdown() : $0.finishShutdown() } }
            })
        }
    }

    /// Runs `body` on each `signal` until the loop stops.
    func watch(_ signal: Int32, _ body: @escaping () -> Void) {
        do { signalWatchers.append(try SignalWatcher(loop: eventLoop, signal: signal, body)) } catch {
            logger.error("cannot watch signal \(signal): \(error)")
        }
    }

    /// Serves a new connection over `transport` (counted under `admittedHost` by the caps, if given;
    /// `toResume`: past that address's cap, to resume one of its parked sessions).
    @discardableResult
    func accept(_ transport: any Transport, admittedHost: String? = nil, toResume: Bool = false) -> Connection? {
        guard phase == .running || phase == .draining else {
            if let admittedHost { quota.release(admittedHost) }
            transport.closeNow()
            return nil
        }
        connectionsMade += 1
        let connection = Connection(id: (connectionsMade - 1) * UInt64(loopCount) + UInt64(index) + 1, transport: transport, core: self)
        connection.admittedHost = admittedHost
        connection.admittedToResume = toResume
        connections[connection.id] = connection
        stats.connectionsTotal += 1
        transport.start { event in connection.handle(event) }
        return connection
    }

    /// Forgets a connection without counting a close: its HELLO resumed a session, whose connection
    /// now has its transport.
    func connectionHandedOver(_ connection: Connection) {
        connections.removeValue(forKey: connection.id)
    }

    /// A connection whose HELLO made a session goes on as `successor` (of the same id).
    func connectionReplaced(by successor: Connection) { connections[successor.id] = successor }

    /// A parked session's connection leaves the table (it counts under the caps until its session ends
    /// or resumes); a resumed one comes back.
    func connectionParked(_ connection: Connection) {
        connections.removeValue(forKey: connection.id)
        if let host = connection.admittedHost { quota.setParked(true, host: host) }
    }
    func connectionResumed(_ connection: Connection) {
        connections[connection.id] = connection
        if let host = connection.admittedHost { quota.setParked(false, host: host) }
    }
    /// A connection whose resuming HELLO did not move it to another loop after all is back.
    func connectionReturned(_ connection: Connection) { connections[connection.id] = connection }

    /// A parked session ended: its connection, which had left the table, is counted closed, and its
    /// place under the caps is given back.
    func parkedSessionEnded(_ connection: Connection) {
        tallies.closes[CloseReason.sessionEnded.rawValue, default: 0] += 1
        if let host = connection.admittedHost { quota.setParked(false, host: host) }
        releaseAdmission(of: connection)
    }


    /// Ends every parked session (a shutdown's drain begins).
    func endParkedSessions() {
        for session in sessions.parked { session.connection?.endParked(.closed) }
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        guard connections.removeValue(forKey: connection.id) != nil else { return }
        tallies.closes[reason.rawValue, default: 0] += 1
        releasedSinceTrim += connection.pendingBytes
        if reason == .slowConsumer { stats.slowConsumersClosed += 1 }
        if !connection.transport.isOpen { return releaseAdmission(of: connection) }
        closingConnections.append(connection)
    }

    /// Gives a gone connection's place under the caps back: once its socket is closed, not when its
    /// close begins, so that connections lingering in a graceful close (at most a second) count too.
    func releaseAdmission(of connection: Connection) {
        guard let host = connection.admittedHost else { return }
        connection.admittedHost = nil
        quota.release(host)
    }

    var welcome: ChannelValue {
        .stringMap(["version": 1, "server": .string(switchboardServerName),
                    "maxFrame": .int(Int(config.maxFrame)), "heartbeatMs": .int(Int(config.heartbeatMs))])
    }

    // MARK: Routing

    /// Serves `name` by `entry`, or no longer (nil): the listeners of the channel it replaces get the end.
    func setChannel(_ name: String, _ entry: ChannelEntry?) {
        if case .event(let old)? = directory.channels[name] {
            old.listeners.deliver(OutboundEvent(channel: name, content: .end, codec: old.codec))
            (old.handler as? any RemovalObserving)?.handlerWasRemoved()
        }
        if let old = directory.channels[name] { channelGone(old.counts) }
        directory.setChannel(name, entry)
    }

    // MARK: Per-turn work

    private func flushDirty() {
        var rounds = 0
        while firstDirty != nil, rounds < 8 {
            // The list taken whole: output made while flushing starts the next round. Its links are moved
            // out (`take`, `swap`), so each connection costs the one release of the list's reference.
            var next: Connection? = nil
            swap(&next, &firstDirty)
            // Newest first (as Redis does): a request's reply is made after the output it caused (a room
            // post's broadcast), so its sender can send again while the other connections are written.
            while let connection = next.take() {
                swap(&next, &connection.outbound.nextDirty)
                connection.outbound.isDirty = false  // here, not in flush(): marked means linked
                connection.flush()
            }
            rounds += 1
        }
        // This turn's calls and answers to other nodes, those the writes above let in included
        // (a paused connection reads again once its output drains).
        cluster?.flush()
        if firstDirty != nil { kickLoop() }  // more output is ready: don't let the loop block
    }

    /// Makes the loop run another turn without blocking, whoever asks (leftover output, a finished
    /// drain). One timer with one callback, so that no request can replace another's.
    func kickLoop() {
        kick?.start(after: 0) { [unowned self] in
            if phase == .draining, isDrained { drainFinished() }
        }
    }

    private func keepHouse() {
        let now = eventLoop.now
        if !pipeline.isEmpty { judgeHoldingsAgain() }
        // Many connections closing with full buffers (slow consumers) free a lot at once, scattered
        // through the loop thread's malloc arena: give it back, at most once a second. Checked before
        // this pass closes anything, so that the buffers of earlier closes (freed by the close
        // callbacks after the pass that closed them) are already free.
        if releasedSinceTrim >= 16 << 20, now - lastTrim >= 1000 {
            MallocTuning.releaseFreeMemory()
            releasedSinceTrim = 0
            lastTrim = now
        }
        for session in sessions.expired(at: now) { session.connection?.endParked(.expired) }
        for connection in Array(connections.values) {
            connection.dropStaleRoute()
            if let session = connection.session, session.positionIsDueByTime(at: now) { connection.markDirty() }
            if let since = connection.peerFinishedAt, now - since >= config.drainTimeoutMs {
                connection.abandonOpenRequests()
                continue
            }
            if let since = connection.overLimitSince, connection.isOverOutboundLimit,
               now - since >= config.slowConsumerGraceMs {
                logger.info("closing slow consumer", metadata: ["connection.id": "\(connection.id)"])
                connection.writeError(.slowConsumer)
                connection.flush()
                connection.close(.slowConsumer)
                continue
            }
            if let deadline = connection.missedDeadline(at: now) {
                connection.timeOut(deadline)
                continue
            }
            // Paused input is the server's doing (the peer may well be sending): no heartbeat verdict.
            guard config.heartbeatMs > 0, !connection.isText, !connection.isInputPaused else { continue }
            if now - connection.lastInbound >= 2 * config.heartbeatMs {
                connection.close(.heartbeatTimeout)
            } else if connection.hasChosenBinary, now - connection.lastPing >= config.heartbeatMs {
                // Not before the client's first byte: a PING must not decide a WebSocket's framing, nor
                // reach a client about to speak text mode.
                connection.lastPing = now
                connection.writeFrame(.ping, payload: nil)
            }
        }
        closingConnections.removeAll { connection in
            if connection.transport.isOpen {
                guard let since = connection.closingSince, now - since >= min(1000, config.slowConsumerGraceMs) else { return false }
                connection.close(.shutdown)  // the linger is over (the reason was counted when it began)
            }
            releaseAdmission(of: connection)
            return true
        }
    }

    // MARK: Shutdown

    /// GOAWAY to everyone, refuse new requests, wait for in-flight ones up to the drain timeout.
    func beginShutdown() {
        guard phase == .running else { return }
        phase = .draining
        endParkedSessions()
        logger.notice("shutting down: draining \(stats.repliesPending) in-flight requests")
        // The ports stay open while draining, so that a health check can see it (`/healthz` answers 503);
        // requests on connections made meanwhile get `going_away`.
        // A connection that has sent nothing has no mode yet (nor a finished TLS or WebSocket
        // handshake): a frame now could only garble what it is about to say, so it gets its GOAWAY
        // when its first bytes choose a mode.
        for connection in connections.values { connection.sendGoAway() }
        // Other nodes' calls go to other holders from now on. Other loops' calls still come: those
        // loops refuse new requests themselves, and one made just before they heard of the shutdown
        // is served here, as on one loop.
        cluster?.stopTakingCalls()
        let timer = try? Timer(loop: eventLoop)
        shutdownTimer = timer
        timer?.start(after: config.drainTimeoutMs) { [unowned self] in finishShutdown() }
        requestFinished()
    }

    /// Called whenever a request is answered: the drain may be over.
    func requestFinished() {
        guard phase == .draining, isDrained else { return }
        kickLoop()
    }

    /// Whether no request waits for an answer: from this node's clients, nor from other nodes' (served
    /// here by a client holding the channel).
    private var isDrained: Bool { stats.repliesPending == 0 && (cluster?.servingCount ?? 0) == 0 && (siblings?.servingCount ?? 0) == 0 }

    /// Nothing waits for an answer on this loop: with one loop the drain is over; with several it is
    /// over when every loop's is (until then this loop's port stays open, and its new requests get
    /// `going_away` at once, so it stays drained).
    private func drainFinished() {
        guard let group, group.count > 1 else { return finishShutdown() }
        guard !reportedDrained else { return }
        reportedDrained = true
        if group.loopDrained() == group.count {
            for core in group.cores { core.onLoop { $0.finishShutdown() } }
        }
    }

    /// Answers what is left with `going_away`, ends every stream, closes every connection, stops the loop.
    func finishShutdown() {
        guard phase == .draining || phase == .running else { return }
        phase = .closing
        endParkedSessions()
        cluster?.stopServing()  // calls from other nodes get going_away; the bus stays up to send it
        siblings?.stopServing()
        listener?.cancel()
        listener = nil
        tlsListener?.cancel()
        tlsListener = nil
        // Every open request is answered before any connection closes: a holder's leaving would
        // otherwise answer the requests forwarded to it with `handler_gone`.
        let open = Array(connections.values)
        for connection in open { connection.answerAllOpenRequests(with: .error(.goingAway)) }
        for connection in open {
            for stream in Array(connection.streams.values) {
                stream.finishForShutdown()
                connection.endStream(stream, notifyHandler: true)
            }
            connection.closeAfterFlush(.shutdown)
        }
        var waited: UInt64 = 0
        shutdownTimer?.stop()
        shutdownTimer?.start(after: 10, repeat: 10) { [unowned self] in
            waited += 10
            closingConnections.removeAll { !$0.transport.isOpen }
            guard closingConnections.isEmpty || waited >= 2000 else { return }
            // Loop 0 stops last, so that ``Server/run(handlingSignals:)`` and ``Server/runOnCurrentThread(handlingSignals:)`` return when all have.
            if index == 0, let group, group.count > 1, group.stoppedLoops < group.count - 1, waited < 4000 { return }
            for connection in closingConnections { connection.close(.shutdown) }
            cluster?.close()
            siblings?.close()
            phase = .stopped
            logger.notice("stopped")
            eventLoop.stop()
        }
    }

    /// Once the loop has stopped (its last jobs run, its handles not yet closed): drops every table, so
    /// that handlers which capture the server (and so this core) no longer keep it alive, and neither
    /// do connections, streams or timers.
    func releaseAll() {
        endParkedSessions()
        for connection in Array(connections.values) + closingConnections { connection.close(.shutdown) }
        connections = [:]
        closingConnections = []
        while let connection = firstDirty {
            firstDirty = connection.outbound.nextDirty
            connection.outbound.nextDirty = nil
        }
        directory.removeAll()
        cluster?.close()
        cluster = nil
        siblings?.close()
        siblings = nil
        group = nil
        listener = nil
        tlsListener = nil
        beforeSleep = nil
        housekeeping = nil
        metricsTimer = nil
        kick = nil
        shutdownTimer = nil
        signalWatchers = []
        phase = .stopped
    }
}

/// The server's version.
public let switchboardVersion = "0.1.0"
/// The server's name and version, as WELCOME's `server`, `switchboard/stats`' `server` and the first word
/// of `switchboard --version` give it.
public let switchboardServerName = "switchboard/\(switchboardVersion)"
