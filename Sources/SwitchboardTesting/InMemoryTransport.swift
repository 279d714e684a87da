import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// A transport with no socket under it, in the spirit of SwiftNIO's `EmbeddedChannel`: the test plays
/// the peer. What the peer sends goes in with ``send(_:)``; what the connection wrote comes out of
/// ``takeWritten(max:)``. Loop thread only (the thread driving the loop).
///
/// The peer's kernel is modelled by ``peerWindow``: unread bytes beyond it count as queued in the
/// transport, as a slow reader's would; taking them out drains the queue (and reports `.drained`).
/// Input sent while reading is paused waits, as it would in the peer's socket, until reading resumes
/// and ``EmbeddedServer`` delivers it; so does the peer's end of stream, which a paused TCP reader
/// cannot see either.
public final class InMemoryTransport: Transport {
    private var handler: ((TransportEvent) -> Void)?
    private var unread: [UInt8] = []
    private var waitingInput: [[UInt8]] = []
    /// Bytes of unread output the peer's socket holds before writes queue up; unlimited by default.
    /// Widening it so that nothing is queued any more reports `.drained`, as the kernel taking the
    /// rest of a write would.
    public var peerWindow = Int.max {
        didSet {
            let wasQueued = oldValue != .max && unread.count > oldValue
            if wasQueued, queuedBytes == 0, !isClosed { handler?(.drained) }
        }
    }
    /// Whether the connection has paused reading.
    public private(set) var isReadingPaused = false
    /// Whether the connection asked for a graceful close (``closeAfterWrites()``).
    public private(set) var isClosingGracefully = false
    /// Whether the transport is closed for good.
    public private(set) var isClosed = false
    /// The peer has closed its sending side.
    public private(set) var peerHasClosed = false
    /// A graceful close whose peer had already closed: it completes on the next delivery turn, not
    /// inside the owner's call.
    private var finishIsDue = false
    /// A name for the peer, for messages; also its ``remoteAddress``.
    public let name: String
    public var remoteAddress: String { name }
    /// Whether the server takes the peer to be on this machine; true unless a test says otherwise.
    public var isLoopbackPeer = true
    public var scheme: String { "memory" }
    /// The peer's end of stream (or failure), waiting behind input held back by a pause.
    private var waitingClose: UVError??

    /// Makes a transport; ``EmbeddedServer/connect()`` makes one and hands it to the server.
    public init(name: String = "memory") { self.name = name }

    // MARK: The peer's side

    /// The peer sends `bytes`: delivered now, or when reading resumes.
    public func send(_ bytes: [UInt8]) {
        guard !isClosed, !bytes.isEmpty else { return }
        if isReadingPaused || !waitingInput.isEmpty || handler == nil {
            waitingInput.append(bytes)
        } else {
            handler?(.data(bytes))
        }
    }

    /// Delivers input that waited while reading was paused, and completes a graceful close whose peer
    /// had already closed; true if anything was delivered.
    @discardableResult
    public func deliverWaitingInput() -> Bool {
        if finishIsDue {
            finishIsDue = false
            finish()
            return true
        }
        var delivered = false
        while !isClosed, !isReadingPaused, handler != nil, !waitingInput.isEmpty {
            handler?(.data(waitingInput.removeFirst()))
            delivered = true
        }
        if !isClosed, !isReadingPaused, waitingInput.isEmpty, let error = waitingClose {
            waitingClose = nil
            handler?(.closed(error))
            delivered = true
        }
        return delivered
    }

    /// Bytes the peer has not read yet.
    public var unreadCount: Int { unread.count }

    /// The peer reads up to `max` bytes of what the connection wrote.
    public func takeWritten(max: Int = .max) -> [UInt8] {
        let wasQueued = queuedBytes > 0
        let count = min(max, unread.count)
        let taken = Array(unread.prefix(count))
        unread.removeFirst(count)
        if wasQueued, queuedBytes == 0, !isClosed { handler?(.drained) }
        return taken
    }

    /// The peer sends a frame.
    public func send(_ frame: Frame) { send(frame.bytes) }

    /// The peer sends a text-mode line (the newline is added).
    public func send(line: String) { send(Array((line + "\n").utf8)) }

    /// The peer reads every complete frame written so far (a partial one stays unread).
    public func frames() throws -> [Frame] {
        var buffer = InboundBuffer()
        buffer.append(unread)
        var decoder = FrameDecoder(maxFrame: 1 << 30)
        var frames: [Frame] = []
        while case .frame(let frame)? = try decoder.next(from: &buffer) { frames.append(frame) }
        _ = takeWritten(max: unread.count - buffer.readableBytes)
        return frames
    }

    /// The peer reads every complete text-mode line written so far, parsed as JSON.
    public func lines() throws -> [ChannelValue] {
        guard let end = unread.lastIndex(of: UInt8(ascii: "\n")) else { return [] }
        let text = takeWritten(max: end + 1)
        return try text.split(separator: UInt8(ascii: "\n")).map { try JSONText.parse(Array($0)) }
    }

    /// The peer closes its sending side (end of stream), or the connection fails with `error`.
    public func peerCloses(error: UVError? = nil) {
        guard !isClosed, !peerHasClosed else { return }
        peerHasClosed = true
        if isClosingGracefully { return finish() }
        if isReadingPaused || !waitingInput.isEmpty { return waitingClose = .some(error) }
        handler?(.closed(error))
    }

    // MARK: Transport

    public func start(_ handler: @escaping (TransportEvent) -> Void) { self.handler = handler }

    public func write(_ bytes: inout [UInt8]) {
        if !isClosed { unread.append(contentsOf: bytes) }
        bytes.removeAll(keepingCapacity: true)
    }

    public var queuedBytes: Int { peerWindow == .max ? 0 : max(0, unread.count - peerWindow) }
    public var isOpen: Bool { !isClosed }
    public func pauseReading() { isReadingPaused = true }
    public func resumeReading() { isReadingPaused = false }

    /// Graceful: output stays readable; the close completes when the peer closes too (``peerCloses(error:)``).
    public func closeAfterWrites() {
        guard !isClosed else { return }
        isClosingGracefully = true
        waitingInput = []
        finishIsDue = peerHasClosed
    }

    public func closeNow() {
        guard !isClosed else { return }
        isClosed = true
        handler = nil
        waitingInput = []
    }

    private func finish() {
        let handler = self.handler
        closeNow()
        handler?(.closed(nil))
    }
}
