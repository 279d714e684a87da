/// What a transport reports to the connection above it.
public enum TransportEvent {
    /// Bytes arrived (a fresh array; the owner may keep it).
    case data([UInt8])
    /// The peer closed its side, or the connection failed.
    case closed(UVError?)
    /// Everything queued has been handed on (to the kernel, or to the layer below).
    case drained
    /// A layer (TLS) gave up on the connection; the owner closes it.
    case failed(TransportFailure)
}

/// Why a layered transport gave up on a connection.
public struct TransportFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// The TLS handshake failed: a plain-text client, an untrusted or missing certificate, no common protocol.
        case tlsHandshakeFailed
        /// The TLS handshake did not finish in time.
        case tlsHandshakeTimeout
        /// A TLS error after the handshake, or a peer that stopped in the middle of a record.
        case tlsError
        /// A WebSocket protocol error, or a message over the limit.
        case webSocketError
        /// A WebSocket from a browser origin that is not allowed.
        case webSocketRefused
    }

    public let kind: Kind
    public let message: String

    public init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { "\(kind.rawValue): \(message)" }
}

/// The seam between a server or client connection and the bytes it travels on: TCP today, an
/// in-memory pipe in tests and fuzzers, TLS and WebSocket layered on top of either later.
///
/// Loop thread only, like the connection that owns it. Every event is delivered on the loop thread,
/// never from inside a call the owner makes, except `.closed` when that call fails at once (a write,
/// resuming reading, or starting a graceful close).
public protocol Transport: AnyObject {
    /// Starts delivering events to `handler`.
    func start(_ handler: @escaping (TransportEvent) -> Void)
    /// Writes all of `bytes` after earlier writes and empties the array (keeping its capacity when small).
    func write(_ bytes: inout [UInt8])
    /// Bytes accepted by ``write(_:)`` that have not been handed on yet.
    var queuedBytes: Int { get }
    /// Whether the transport can still be written to.
    var isOpen: Bool { get }
    /// Who is at the other end, for logs and plugins: `host:port` for TCP.
    var remoteAddress: String { get }
    /// Whether the peer is on this machine (a loopback address): the server's own default for what only
    /// its operators may do.
    var isLoopbackPeer: Bool { get }
    /// Who the peer proved to be, if the transport verified it: a TLS client certificate's subject.
    var peerIdentity: String? { get }
    /// What the connection runs over, for operators: `tcp`, `tls`, `ws` or `wss`.
    var scheme: String { get }
    /// Stops delivering `.data` until ``resumeReading()`` (the peer then fills its send buffer and waits).
    func pauseReading()
    /// Starts delivering `.data` again.
    func resumeReading()
    /// Closes gracefully: queued bytes go out, the sending side is shut, and input is read and discarded
    /// until the peer closes too (so the kernel never answers with a reset that could destroy a final
    /// error frame), or until ``closeNow()``. Then one `.closed(nil)` is delivered.
    func closeAfterWrites()
    /// The same, saying why, for transports that tell the peer (a WebSocket's close code).
    func closeAfterWrites(_ intent: CloseIntent)
    /// Closes at once; queued bytes are dropped.
    func closeNow()
    /// The same, first telling the peer why, for transports that can (a WebSocket's close frame).
    func closeNow(_ intent: CloseIntent)
    /// Whether the layers here hold the start of something the peer has not finished: part of an HTTP
    /// request head, of a WebSocket frame or of a TLS record (the owner times it: wire.md, "Limits").
    var holdsPartialInput: Bool { get }
}

extension Transport {
    public var peerIdentity: String? { nil }
    /// Whether ``remoteAddress`` is a loopback address (``isLoopbackAddress(_:)``).
    public var isLoopbackPeer: Bool { isLoopbackAddress(remoteAddress) }
    public var scheme: String { "tcp" }
    public func closeAfterWrites(_ intent: CloseIntent) { closeAfterWrites() }
    public func closeNow(_ intent: CloseIntent) { closeNow() }
    public var holdsPartialInput: Bool { false }
}

/// Whether `address` (`host:port`, `[host]:port`) is a loopback address: 127.0.0.0/8, `::1`, or
/// 127.0.0.0/8 mapped into IPv6.
public func isLoopbackAddress(_ address: String) -> Bool {
    let lowered = hostOfAddress(address).lowercased()
    let ipv4 = lowered.hasPrefix("::ffff:") ? lowered.dropFirst(7) : Substring(lowered)
    let octets = ipv4.split(separator: ".", omittingEmptySubsequences: false)
    return lowered == "::1" || (octets.count == 4 && octets[0] == "127" && octets.allSatisfy { UInt8($0) != nil })
}

/// The host of `address` (`host:port`, `[host]:port`), without its port; `address` itself when it has
/// no port.
public func hostOfAddress(_ address: String) -> String {
    if address.hasPrefix("["), let close = address.firstIndex(of: "]") {
        return String(address[address.index(after: address.startIndex)..<close])
    }
    guard let colon = address.lastIndex(of: ":"), address.firstIndex(of: ":") == colon else { return address }
    return String(address[..<colon])
}
