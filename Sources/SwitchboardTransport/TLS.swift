import COpenSSL

/// A TLS setting that OpenSSL refused, or a connection's TLS failure, with OpenSSL's reasons.
public struct TLSError: Error, Sendable, CustomStringConvertible {
    public let description: String

    /// `what`, followed by every reason on this thread's OpenSSL error queue (which it empties).
    static func drainingQueue(_ what: String) -> TLSError {
        var reasons: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            var text = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &text, text.count)
            reasons.append(String(decoding: text.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self))
        }
        return TLSError(description: reasons.isEmpty ? what : "\(what): \(reasons.joined(separator: "; "))")
    }
}

/// One side's TLS settings, loaded once into an OpenSSL context that every connection shares: TLS 1.2
/// and 1.3 only, OpenSSL's default ciphers, no renegotiation, no compression.
///
/// `@unchecked Sendable`: an `SSL_CTX` is only changed here, in the initializers, before anything else
/// can see it; afterwards connections on any thread only read it (`SSL_new`), which OpenSSL supports,
/// and its reference count is atomic.
public final class TLSContext: @unchecked Sendable {
    let context: OpaquePointer
    /// Whether the other side must present a certificate this one trusts.
    public let requiresPeerCertificate: Bool
    let isServer: Bool

    private init(isServer: Bool, requiresPeerCertificate: Bool) throws(TLSError) {
        guard let context = SSL_CTX_new(isServer ? TLS_server_method() : TLS_client_method()) else {
            throw .drainingQueue("SSL_CTX_new")
        }
        self.context = context
        self.isServer = isServer
        self.requiresPeerCertificate = requiresPeerCertificate
        guard switchboard_SSL_CTX_set_min_tls12(context) == 1 else { throw .drainingQueue("cannot require TLS 1.2") }
        switchboard_SSL_CTX_set_safe_options(context)
    }

    deinit { SSL_CTX_free(context) }

    /// A server's context: its certificate chain and key (PEM files), and, with `clientCAFile`, mutual
    /// TLS: clients must present a certificate signed by one of those CAs.
    public static func server(certificateFile: String, keyFile: String, clientCAFile: String? = nil) throws(TLSError) -> TLSContext {
        let tls = try TLSContext(isServer: true, requiresPeerCertificate: clientCAFile != nil)
        try tls.use(certificateFile: certificateFile, keyFile: keyFile)
        if let clientCAFile {
            guard SSL_CTX_load_verify_locations(tls.context, clientCAFile, nil) == 1 else {
                throw .drainingQueue("cannot load client CA \(clientCAFile)")
            }
            if let names = SSL_load_client_CA_file(clientCAFile) { SSL_CTX_set_client_CA_list(tls.context, names) }
            SSL_CTX_set_verify(tls.context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nil)
        }
        return tls
    }

    /// A client's context: the CAs it trusts (PEM; the system's when nil), and a certificate and key
    /// to present to servers that ask for one.
    public static func client(caFile: String? = nil, certificateFile: String? = nil, keyFile: String? = nil) throws(TLSError) -> TLSContext {
        let tls = try TLSContext(isServer: false, requiresPeerCertificate: true)
        if let caFile {
            guard SSL_CTX_load_verify_locations(tls.context, caFile, nil) == 1 else { throw .drainingQueue("cannot load CA \(caFile)") }
        } else {
            SSL_CTX_set_default_verify_paths(tls.context)
        }
        SSL_CTX_set_verify(tls.context, SSL_VERIFY_PEER, nil)
        if let certificateFile {
            try tls.use(certificateFile: certificateFile, keyFile: keyFile ?? certificateFile)
        }
        return tls
    }

    private func use(certificateFile: String, keyFile: String) throws(TLSError) {
        guard SSL_CTX_use_certificate_chain_file(context, certificateFile) == 1 else {
            throw .drainingQueue("cannot load certificate \(certificateFile)")
        }
        guard SSL_CTX_use_PrivateKey_file(context, keyFile, SSL_FILETYPE_PEM) == 1 else {
            throw .drainingQueue("cannot load key \(keyFile)")
        }
        guard SSL_CTX_check_private_key(context) == 1 else { throw .drainingQueue("\(keyFile) does not match \(certificateFile)") }
    }
}

/// TLS over another transport (TCP), driven on the same loop through a BIO of its own: OpenSSL reads the
/// ciphertext that arrived from below straight out of the array it came in, and what OpenSSL has to send
/// is appended to one buffer written below. No second event loop, no blocking call, no memory BIO to copy
/// through. Everything above sees plaintext, as over TCP.
///
/// A handshake must finish within `handshakeTimeoutMs`. Failures reach the owner as
/// ``TransportEvent/failed(_:)``: a failed or timed-out handshake (a plain-text client, an untrusted
/// certificate), a TLS error after it, or a peer that stopped in the middle of a record.
public final class TLSTransport: Transport {
    private let inner: any Transport
    private let ssl: OpaquePointer
    private let loop: EventLoop
    private let handshakeTimeoutMs: UInt64
    private var handler: ((TransportEvent) -> Void)?
    private var isEstablished = false
    /// Written by the owner before the handshake finished.
    private var pendingPlaintext: [UInt8] = []
    /// Ciphertext from below that OpenSSL has not read yet: the arrays as they arrived, read from `inputIndex`.
    fileprivate var input: [UInt8] = []
    fileprivate var inputIndex = 0
    /// What OpenSSL wrote, for the transport below: handed down by ``flushOutgoing()``.
    fileprivate var ciphertext: [UInt8] = []
    private var isPaused = false
    /// A failure or the end was delivered: nothing more goes up.
    private var isFinished = false
    /// The connection failed, or the owner closed it: nothing more goes down.
    private var isBroken = false
    /// The owner began a graceful close: an end before the handshake finished is its doing.
    private var isClosingByOwner = false
    private var timer: Timer?
    /// The SSL went to another loop (``detach()``): this transport no longer frees it.
    private var isDetached = false
    /// The subject of the certificate the peer presented and this side verified (mutual TLS), as
    /// RFC 2253 text such as `CN=alice,O=Example`.
    public private(set) var peerSubject: String?
    /// The protocol agreed on (`TLSv1.3`), once established.
    public private(set) var protocolVersion: String?

    /// TLS over `inner`, as `context` says (a client sends `serverName` for SNI and checks the server's
    /// certificate against it: a DNS name or an IP address).
    public init(over inner: any Transport, context: TLSContext, serverName: String? = nil, loop: EventLoop,
                handshakeTimeoutMs: UInt64 = 10_000) throws(TLSError) {
        guard let ssl = SSL_new(context.context) else { throw .drainingQueue("SSL_new") }
        guard let bio = BIO_new(TransportBIO.method) else {
            SSL_free(ssl)
            throw .drainingQueue("BIO_new")
        }
        SSL_set_bio(ssl, bio, bio)  // the SSL owns it from here, and frees it before this transport goes
        self.ssl = ssl
        self.inner = inner
        self.loop = loop
        self.handshakeTimeoutMs = handshakeTimeoutMs
        BIO_set_data(bio, Unmanaged.passUnretained(self).toOpaque())
        if context.isServer {
            SSL_set_accept_state(ssl)
            return
        }
        SSL_set_connect_state(ssl)
        // A client always checks the name: an IP address against the certificate's IP entries, anything
        // else as a DNS name (and sent for SNI). No name, or one OpenSSL refuses, is an error, not a
        // connection that trusts any certificate its CAs signed.
        // (Every property is set by now, so a throw runs deinit, which frees the SSL.)
        guard let serverName, !serverName.isEmpty else { throw TLSError(description: "a TLS client needs the server's name") }
        if X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName) != 1 {
            ERR_clear_error()
            guard SSL_set1_host(ssl, serverName) == 1, switchboard_SSL_set_server_name(ssl, serverName) == 1 else {
                throw .drainingQueue("cannot check the server's name \(serverName)")
            }
        }
    }

    /// Goes on, over `inner` on `loop`, with a connection that ``detach()`` took off another loop.
    public init(adopting state: DetachedTLS, over inner: any Transport, loop: EventLoop) {
        ssl = state.ssl
        self.inner = inner
        self.loop = loop
        handshakeTimeoutMs = 0
        isEstablished = true
        input = state.input
        peerSubject = state.peerSubject
        protocolVersion = state.protocolVersion
        BIO_set_data(SSL_get_rbio(ssl), Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        timer?.cancel()
        guard !isDetached else { return }
        BIO_set_data(SSL_get_rbio(ssl), nil)  // nothing OpenSSL does while freeing may reach this going object
        SSL_free(ssl)
    }

    /// Whether ``detach()`` can take this connection to another loop now: established, over TCP, and
    /// with nothing waiting to be written (which could not go along).
    public var canDetach: Bool {
        isEstablished && !isBroken && !isFinished && pendingPlaintext.isEmpty && ciphertext.isEmpty
            && inner is TCPConnection && inner.queuedBytes == 0
    }

    /// Takes the connection off this loop, for ``init(adopting:over:loop:)`` on another: its TLS state
    /// (with the ciphertext OpenSSL has not read) and its socket. Nil when it cannot (``canDetach``).
    /// This transport is closed either way, and never touches the SSL again.
    public func detach() throws(UVError) -> (tls: DetachedTLS, socket: DetachedSocket)? {
        guard canDetach, let tcp = inner as? TCPConnection else {
            closeNow()
            return nil
        }
        isFinished = true
        isBroken = true
        timer?.cancel()
        timer = nil
        handler = nil
        isDetached = true
        BIO_set_data(SSL_get_rbio(ssl), nil)
        let state = DetachedTLS(ssl: ssl, input: Array(input[inputIndex...]), peerSubject: peerSubject, protocolVersion: protocolVersion)
        input = []
        inputIndex = 0
        let socket: DetachedSocket
        do { socket = try tcp.detach() } catch {
            state.close()
            throw error
        }
        return (state, socket)
    }

    public var queuedBytes: Int { inner.queuedBytes + pendingPlaintext.count }
    public var isOpen: Bool { !isBroken && inner.isOpen }
    public var remoteAddress: String { inner.remoteAddress }
    public var isLoopbackPeer: Bool { inner.isLoopbackPeer }
    public var scheme: String { "tls" }
    public var peerIdentity: String? { peerSubject }
    /// Part of a record is in (a handshake in progress has a timeout of its own).
    public var holdsPartialInput: Bool { isEstablished && (inputIndex < input.count || SSL_has_pending(ssl) == 1) }

    public func start(_ handler: @escaping (TransportEvent) -> Void) {
        self.handler = handler
        if let timer = try? Timer(loop: loop) {
            self.timer = timer
            if isEstablished {  // adopted: what came with it is read on the next turn, before anything newer
                timer.start(after: 0) { [weak self] in self?.decrypt() }
            } else {
                timer.start(after: handshakeTimeoutMs) { [weak self] in
                    guard let self, !self.isEstablished else { return }
                    self.fail(.tlsHandshakeTimeout, "no TLS handshake within \(self.handshakeTimeoutMs) ms")
                }
            }
        }
        inner.start { [weak self] event in self?.handleInner(event) }
        if !SSL_is_server(ssl).isTrue { handshake() }  // a client speaks first
    }

    public func write(_ bytes: inout [UInt8]) {
        defer { bytes.removeAll(keepingCapacity: bytes.capacity <= 1 << 20) }
        guard !isBroken, !bytes.isEmpty else { return }  // after the peer's close_notify, writes go on (half-close)
        guard isEstablished else { pendingPlaintext += bytes; return }
        encrypt(bytes)
    }

    public func pauseReading() {
        isPaused = true
        inner.pauseReading()
    }

    public func resumeReading() {
        guard isPaused else { return }
        isPaused = false
        inner.resumeReading()
        // Records that arrived while paused are still inside OpenSSL: deliver them on a later turn (an
        // owner never hears an event from inside its own call).
        guard isEstablished, let timer else { return }
        timer.start(after: 0) { [weak self] in self?.decrypt() }
    }

    public func closeAfterWrites() {
        guard !isBroken else { return inner.closeNow() }  // it failed: nothing is left to send
        isClosingByOwner = true
        if isEstablished {
            SSL_shutdown(ssl)  // close_notify
            flushOutgoing()
        }
        inner.closeAfterWrites()
    }

    public func closeNow() {
        isFinished = true
        isBroken = true
        timer?.cancel()
        timer = nil
        handler = nil
        inner.closeNow()
    }

    // MARK: Driving OpenSSL

    private func handleInner(_ event: TransportEvent) {
        guard !isFinished else { return }
        switch event {
        case .data(let bytes):
            if inputIndex == input.count {
                input = bytes  // adopted, not copied
                inputIndex = 0
            } else {
                input += bytes
            }
            if !isEstablished { handshake() }
            if isEstablished, !isPaused { decrypt() }
        case .closed(let error):
            if error == nil, isClosingByOwner {
                finish(.closed(nil))
            } else if error == nil, !isEstablished {
                fail(.tlsHandshakeFailed, "the peer closed during the TLS handshake")
            } else if error == nil, inputIndex < input.count || SSL_has_pending(ssl) == 1 {
                fail(.tlsError, "the peer stopped in the middle of a TLS record")
            } else {
                finish(.closed(error))
            }
        case .failed(let failure):
            finish(.failed(failure))
        case .drained:
            handler?(.drained)
        }
    }

    private func handshake() {
        let rc = SSL_do_handshake(ssl)
        if rc == 1 {
            isEstablished = true
            timer?.stop()
            protocolVersion = String(cString: switchboard_SSL_version_name(ssl))
            peerSubject = readPeerSubject()
            flushOutgoing()
            if !pendingPlaintext.isEmpty {
                let plaintext = pendingPlaintext
                pendingPlaintext = []
                encrypt(plaintext)
            }
            return
        }
        switch SSL_get_error(ssl, rc) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: flushOutgoing()
        default:
            flushOutgoing()  // the alert, so that the peer learns why
            fail(.tlsHandshakeFailed, TLSError.drainingQueue("TLS handshake failed").description)
        }
    }

    /// Delivers every plaintext byte OpenSSL can give now, in one event. It decrypts into the loop's
    /// read buffer, free while this runs: the transport below copied its bytes out before calling up.
    private func decrypt() {
        guard !isFinished, !isPaused else { return }
        var plaintext: [UInt8] = []
        let scratch = loop.readBuffer
        var ended = false
        reading: while true {
            let n = SSL_read(ssl, scratch, Int32(EventLoop.readBufferSize))
            if n > 0 {
                plaintext.append(contentsOf: UnsafeRawBufferPointer(start: scratch, count: Int(n)))
                // Another SSL_read would only learn that it must wait (at the price of a failed call and
                // SSL_get_error) unless OpenSSL holds more or more ciphertext is waiting.
                if inputIndex == input.count, SSL_pending(ssl) == 0, SSL_has_pending(ssl) == 0 { break reading }
                continue
            }
            switch SSL_get_error(ssl, n) {
            case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: break reading
            case SSL_ERROR_ZERO_RETURN: ended = true; break reading  // close_notify
            default:
                flushOutgoing()
                return fail(.tlsError, TLSError.drainingQueue("TLS error").description)
            }
        }
        flushOutgoing()  // post-handshake messages (TLS 1.3 tickets, key updates)
        if !plaintext.isEmpty { handler?(.data(plaintext)) }
        if ended, !isFinished { finish(.closed(nil)) }
    }

    private func encrypt(_ plaintext: [UInt8]) {
        let written = plaintext.withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32($0.count)) }
        guard written == Int32(plaintext.count) else {
            // Inside the owner's write: the failure reaches it on the next turn, not from inside its call.
            let failure = TLSError.drainingQueue("TLS write failed").description
            isBroken = true
            timer?.start(after: 0) { [weak self] in self?.fail(.tlsError, failure) }
            return
        }
        flushOutgoing()
    }

    /// Hands what OpenSSL wrote to the transport below (which empties the buffer and keeps its capacity).
    /// The bytes leave `ciphertext` first: a transport that reports its end from inside `write` lets the
    /// owner write again, and OpenSSL then appends to `ciphertext` while this call still runs.
    private func flushOutgoing() {
        guard !ciphertext.isEmpty else { return }
        var outgoing: [UInt8] = []
        swap(&outgoing, &ciphertext)
        inner.write(&outgoing)
        if ciphertext.isEmpty { swap(&outgoing, &ciphertext) }  // keeps the capacity for the next record
    }

    /// Gives OpenSSL up to `capacity` bytes of the ciphertext that arrived; 0 when there is none yet.
    fileprivate func readInput(into destination: UnsafeMutableRawPointer, capacity: Int) -> Int {
        let count = min(capacity, input.count - inputIndex)
        guard count > 0 else { return 0 }
        input.withUnsafeBytes { destination.copyMemory(from: $0.baseAddress! + inputIndex, byteCount: count) }
        inputIndex += count
        if inputIndex == input.count {  // all read: let the array go rather than keep it while idle
            input = []
            inputIndex = 0
        }
        return count
    }

    private func readPeerSubject() -> String? {
        guard SSL_get_verify_result(ssl) == X509_V_OK, let certificate = SSL_get1_peer_certificate(ssl) else { return nil }
        defer { X509_free(certificate) }
        guard let name = X509_get_subject_name(certificate), let text = BIO_new(BIO_s_mem()) else { return nil }
        defer { BIO_free(text) }
        X509_NAME_print_ex(text, name, 0, switchboard_XN_FLAG_RFC2253())
        let count = Int(BIO_ctrl_pending(text))
        var bytes = [UInt8](repeating: 0, count: count)
        let n = bytes.withUnsafeMutableBytes { BIO_read(text, $0.baseAddress, Int32(count)) }
        return n > 0 ? String(decoding: bytes.prefix(Int(n)), as: UTF8.self) : nil
    }

    private func fail(_ kind: TransportFailure.Kind, _ message: String) {
        ERR_clear_error()
        isBroken = true
        finish(.failed(TransportFailure(kind: kind, message: message)))
    }

    /// The last event the owner hears.
    private func finish(_ event: TransportEvent) {
        guard !isFinished else { return }
        isFinished = true
        switch event {
        case .failed, .closed(.some): isBroken = true  // a failure, or a socket error
        default: break  // after a clean end (close_notify) writes go on
        }
        timer?.cancel()
        timer = nil
        let handler = self.handler
        self.handler = nil
        handler?(event)
    }
}

/// A TLS connection's state between two loops (``TLSTransport/detach()``), which whoever holds it
/// adopts on a loop (``TLSTransport/init(adopting:over:loop:)``) or frees (``close()``), once.
///
/// `@unchecked Sendable`: it holds the only reference to its SSL (the transport that detached it let go
/// of it, and its BIO points at no transport), so the loop that adopts it is the only thread that uses
/// it from then on. OpenSSL allows an SSL on any thread, one at a time; the hop to the other loop (a
/// job through its mutex-guarded queue) orders this loop's last use before that loop's first.
public struct DetachedTLS: @unchecked Sendable {
    fileprivate let ssl: OpaquePointer
    /// Ciphertext that arrived and OpenSSL has not read yet.
    fileprivate let input: [UInt8]
    fileprivate let peerSubject: String?
    fileprivate let protocolVersion: String?

    /// Frees the state (no loop took it).
    public func close() { SSL_free(ssl) }
}

extension Int32 {
    fileprivate var isTrue: Bool { self != 0 }
}

/// The BIO between OpenSSL and a ``TLSTransport``: reads take the ciphertext that arrived from below,
/// writes append to what goes down. It never blocks and never ends: with nothing to read it asks OpenSSL
/// to retry (the transport calls again when more arrives), and the end of input is the transport's to
/// report. Its data pointer is the transport, unretained: the transport's SSL owns the BIO and is freed
/// in the transport's deinit, and OpenSSL calls the BIO only from calls the transport makes.
private enum TransportBIO {
    /// Made once, then only read by OpenSSL (`BIO_new`), from any thread.
    nonisolated(unsafe) static let method: OpaquePointer = {
        guard let method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "switchboard transport") else {
            fatalError("BIO_meth_new failed: OpenSSL is out of memory at start-up")
        }
        BIO_meth_set_create(method) { bio in
            BIO_set_init(bio, 1)
            return 1
        }
        BIO_meth_set_read_ex(method) { bio, destination, capacity, read in
            BIO_clear_flags(bio, switchboard_BIO_FLAGS_RETRY_READ())
            guard let destination, let read, let transport = owner(bio) else { return 0 }
            let count = transport.readInput(into: destination, capacity: capacity)
            guard count > 0 else {
                BIO_set_flags(bio, switchboard_BIO_FLAGS_RETRY_READ())
                return 0
            }
            read.pointee = count
            return 1
        }
        BIO_meth_set_write_ex(method) { bio, source, count, written in
            BIO_clear_flags(bio, switchboard_BIO_FLAGS_RETRY_READ())  // a write never waits
            guard let source, let written, let transport = owner(bio) else { return 0 }
            transport.ciphertext.append(contentsOf: UnsafeRawBufferPointer(start: source, count: count))
            written.pointee = count
            return 1
        }
        BIO_meth_set_ctrl(method) { _, command, _, _ in command == BIO_CTRL_FLUSH ? 1 : 0 }
        return method
    }()

    private static func owner(_ bio: OpaquePointer?) -> TLSTransport? {
        guard let data = BIO_get_data(bio) else { return nil }
        return Unmanaged<TLSTransport>.fromOpaque(data).takeUnretainedValue()
    }
}
