import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// An accepted connection's socket between two loops (see ``TCPConnection/detach()``): whoever holds
/// it adopts it on a loop or closes it.
public struct DetachedSocket: Sendable {
    let fd: Int32

    /// Closes the socket (no loop took it).
    public func close() { _ = Glibc.close(fd) }
}

/// Accepts TCP connections on one address.
public final class TCPListener: LoopResource {
    private var onConnection: ((TCPConnection) -> Void)?
    private unowned let eventLoop: EventLoop
    /// Told when accepting fails (such as EMFILE: out of file descriptors); the listener goes on.
    public var onAcceptError: ((UVError) -> Void)?

    /// Binds `host:port` (port 0 picks a free one) and starts listening.
    public init(
        loop: EventLoop, host: String, port: Int, backlog: Int32 = 1024,
        onConnection: @escaping (TCPConnection) -> Void
    ) throws(UVError) {
        eventLoop = loop
        super.init(type: UV_TCP)
        let tcp = raw.assumingMemoryBound(to: uv_tcp_t.self)
        let rc = uv_tcp_init(loop.loop, tcp)
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_tcp_init") }
        adopt()
        self.onConnection = onConnection
        do throws(UVError) {
            // A name binds its first address (`localhost`: 127.0.0.1 where the system lists it first).
            let address = try AddressResolver.resolveNow(loop: loop, host: host, port: port)[0]
            try UVError.check(address.withSockaddr { uv_tcp_bind(tcp, $0, 0) }, "listen on \(address)")
            try UVError.check(uv_listen(stream, backlog) { server, status in
                LoopResource.withOwner(UnsafeMutableRawPointer(server), as: TCPListener.self) { listener in
                    guard status == 0 else { return listener.onAcceptError?(UVError(code: status, operation: "accept")) ?? () }
                    listener.acceptOne()
                }
            }, "listen on \(address)")
        } catch {
            close()
            throw error
        }
    }

    private var stream: UnsafeMutablePointer<uv_stream_t> { raw.assumingMemoryBound(to: uv_stream_t.self) }

    private func acceptOne() {
        let connection: TCPConnection
        do { connection = try TCPConnection(loop: eventLoop) } catch {
            onAcceptError?(error)
            return
        }
        let rc = uv_accept(stream, connection.stream)
        guard rc == 0 else {
            connection.close()
            onAcceptError?(UVError(code: rc, operation: "uv_accept"))
            return
        }
        connection.didConnect()
        onConnection?(connection)
    }

    /// The bound port (useful after binding port 0).
    public var port: Int {
        var storage = sockaddr_storage()
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        return withUnsafeMutableBytes(of: &storage) { bytes -> Int in
            let address = bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self)
            guard uv_tcp_getsockname(raw.assumingMemoryBound(to: uv_tcp_t.self), address, &length) == 0 else { return 0 }
            let port = bytes.baseAddress!.assumingMemoryBound(to: sockaddr_in.self).pointee.sin_port
            return Int(UInt16(bigEndian: port))
        }
    }

    /// Stops listening.
    public func cancel() { close() }

    override func willClose() {
        onConnection = nil
        onAcceptError = nil
    }
}

/// One TCP connection. Writes try `uv_try_write` first and copy only what the kernel did not take into a
/// `uv_write` request, so the common case is one syscall and no copy.
public final class TCPConnection: LoopResource, Transport {
    private var handler: ((TransportEvent) -> Void)?
    private var connectCompletion: ((Result<TCPConnection, UVError>) -> Void)?
    /// Bytes handed to `uv_write` whose callbacks have not run yet.
    public var queuedBytes: Int { writeQueueBytes }
    /// Unchecked: a plain integer touched only on the loop thread, by code that never calls out while
    /// accessing it; a server reads it for every event it fans out, where a dynamic check is measurable.
    /// (Private, so other modules reach it through the getter above and this attribute holds.)
    @exclusivity(unchecked) private var writeQueueBytes = 0
    /// Set by ``closeAfterWrites()``: input is discarded from then on, and the handle closes once the
    /// peer has finished and the shutdown (which waits for queued writes) is done.
    private var shutdownRequested = false
    private var shutdownDone = false
    private var peerFinished = false
    private var isReading = false
    /// A write that failed at once: later writes are dropped, and the owner hears of it on the next
    /// loop turn, never from inside its own ``write(_:)`` call (where it may be midway through its state).
    private var writeFailure: UVError?
    private var failureReport: Timer?

    init(loop: EventLoop) throws(UVError) {
        super.init(type: UV_TCP)
        let rc = uv_tcp_init(loop.loop, raw.assumingMemoryBound(to: uv_tcp_t.self))
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_tcp_init") }
        adopt()
    }

    var stream: UnsafeMutablePointer<uv_stream_t> { raw.assumingMemoryBound(to: uv_stream_t.self) }

    /// Opens a connection to `host:port`: a host name (resolved by ``AddressResolver``, each address
    /// tried in turn until one answers) or an IPv4 or IPv6 literal; `completion` runs on the loop.
    public static func connect(
        loop: EventLoop, host: String, port: Int, _ completion: @escaping (Result<TCPConnection, UVError>) -> Void
    ) {
        AddressResolver.resolve(loop: loop, host: host, port: port) { resolved in
            switch resolved {
            case .failure(let error): completion(.failure(error))
            case .success(let addresses): connect(loop: loop, to: addresses[...], completion)
            }
        }
    }

    /// Tries `addresses` in turn; the last one's failure is the one reported.
    private static func connect(
        loop: EventLoop, to addresses: ArraySlice<SocketAddress>, _ completion: @escaping (Result<TCPConnection, UVError>) -> Void
    ) {
        guard let address = addresses.first else { return }
        let next: (UVError) -> Void = { error in
            addresses.count > 1 ? connect(loop: loop, to: addresses.dropFirst(), completion) : completion(.failure(error))
        }
        let connection: TCPConnection
        do { connection = try TCPConnection(loop: loop) } catch { return completion(.failure(error)) }
        connection.connectCompletion = { result in
            switch result {
            case .success: completion(result)
            case .failure(let error): next(UVError(code: error.code, operation: "connect to \(address)"))
            }
        }
        let request = UnsafeMutablePointer<uv_connect_t>.allocate(capacity: 1)
        request.initialize(to: uv_connect_t())
        let rc = address.withSockaddr { address in
            uv_tcp_connect(request, connection.raw.assumingMemoryBound(to: uv_tcp_t.self), address) { request, status in
                guard let request else { return }
                let handle = request.pointee.handle
                request.deallocate()
                LoopResource.withOwner(UnsafeMutableRawPointer(handle), as: TCPConnection.self) { connection in
                    guard let completion = connection.connectCompletion else { return }
                    connection.connectCompletion = nil
                    if status < 0 {
                        connection.close()
                        completion(.failure(UVError(code: status, operation: "uv_tcp_connect")))
                    } else {
                        connection.didConnect()
                        completion(.success(connection))
                    }
                }
            }
        }
        if rc < 0 {  // the callback will never run
            request.deallocate()
            connection.connectCompletion = nil
            connection.close()
            next(UVError(code: rc, operation: "connect to \(address)"))
        }
    }

    func didConnect() { uv_tcp_nodelay(raw.assumingMemoryBound(to: uv_tcp_t.self), 1) }

    /// Takes the socket off this loop, for ``adopt(_:loop:)`` on another: a close-on-exec duplicate of
    /// its descriptor (this handle closes either way).
    public func detach() throws(UVError) -> DetachedSocket {
        defer { close() }
        var fd: uv_os_fd_t = -1
        try UVError.check(uv_fileno(handle, &fd), "uv_fileno")
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw UVError(code: -errno, operation: "dup") }
        return DetachedSocket(fd: copy)
    }

    /// Serves on `loop` a socket that ``detach()`` took off another loop.
    public static func adopt(_ socket: DetachedSocket, loop: EventLoop) throws(UVError) -> TCPConnection {
        let connection: TCPConnection
        do { connection = try TCPConnection(loop: loop) } catch {
            socket.close()
            throw error
        }
        let rc = uv_tcp_open(connection.raw.assumingMemoryBound(to: uv_tcp_t.self), socket.fd)
        guard rc == 0 else {
            connection.close()
            socket.close()
            throw UVError(code: rc, operation: "uv_tcp_open")
        }
        connection.didConnect()
        return connection
    }

    /// The peer's `host:port` (`[host]:port` for IPv6); `unknown` once the socket has gone.
    public private(set) lazy var remoteAddress: String = {
        guard !isClosing else { return "unknown" }
        let address = SocketAddress { uv_tcp_getpeername(raw.assumingMemoryBound(to: uv_tcp_t.self), $0, $1) }
        return address?.description ?? "unknown"
    }()

    /// Whether the connection can still be written to.
    public var isOpen: Bool { !isClosing }

    /// Starts delivering events to `handler`.
    public func start(_ handler: @escaping (TransportEvent) -> Void) {
        self.handler = handler
        resumeReading()
    }

    /// Stops delivering data; queued writes continue.
    public func pauseReading() {
        guard !isClosing, isReading, !shutdownRequested else { return }
        isReading = false
        uv_read_stop(stream)
    }

    /// Delivers data again after ``pauseReading()``.
    public func resumeReading() {
        guard !isClosing, !isReading, !peerFinished else { return }
        isReading = true
        let rc = uv_read_start(stream, { handle, _, buf in
            guard let handle, let loop = handle.pointee.loop, let owner = loop.pointee.data else { return }
            // Lent, not retained: the event loop runs this callback from its own `run`, which holds it.
            let readBuffer = Unmanaged<EventLoop>.fromOpaque(owner)._withUnsafeGuaranteedRef { $0.readBuffer }
            buf!.pointee = uv_buf_init(readBuffer.assumingMemoryBound(to: CChar.self), UInt32(EventLoop.readBufferSize))
        }, { stream, nread, buf in
            LoopResource.withOwner(UnsafeMutableRawPointer(stream), as: TCPConnection.self) { $0.didRead(nread, buf!.pointee.base) }
        })
        if rc < 0 {
            isReading = false
            handler?(.closed(UVError(code: rc, operation: "uv_read_start")))
        }
    }

    /// A read callback's outcome; `nread == 0` is "try again" (the buffer is the loop's, nothing to free).
    private func didRead(_ nread: Int, _ base: UnsafeMutablePointer<CChar>?) {
        if nread < 0 {
            isReading = false
            peerFinished = true
            uv_read_stop(stream)
        }
        if shutdownRequested {  // closing gracefully: the peer's input is drained, not delivered
            if nread < 0, shutdownDone { finishClosing() }
            return
        }
        if nread > 0 {
            handler?(.data([UInt8](UnsafeRawBufferPointer(start: base, count: nread))))
        } else if nread < 0 {
            handler?(.closed(nread == Int(UV_EOF.rawValue) ? nil : UVError(code: Int32(nread), operation: "read")))
        }
    }

    /// Writes all of `bytes` (in order after earlier writes) and empties the array, keeping its capacity.
    public func write(_ bytes: inout [UInt8]) {
        guard !isClosing, !bytes.isEmpty, writeFailure == nil else { bytes.removeAll(keepingCapacity: true); return }
        var written = 0
        if writeQueueBytes == 0 {
            let rc = bytes.withUnsafeBytes { raw -> Int32 in
                var buf = uv_buf_init(UnsafeMutableRawPointer(mutating: raw.baseAddress!).assumingMemoryBound(to: CChar.self),
                                      UInt32(raw.count))
                return uv_try_write(stream, &buf, 1)
            }
            if rc > 0 {
                written = Int(rc)
            } else if rc < 0, rc != UV_EAGAIN.rawValue {
                bytes.removeAll(keepingCapacity: true)
                return reportLater(UVError(code: rc, operation: "uv_try_write"))
            }
        }
        let remaining = bytes.count - written
        if remaining > 0 { queueWrite(bytes, from: written) }
        bytes.removeAll(keepingCapacity: bytes.capacity <= 1 << 20)
    }

    /// Copies the unwritten tail into one allocation holding the `uv_write_t` and the bytes; the write
    /// callback frees it. The request's `data` carries the byte count.
    private func queueWrite(_ bytes: [UInt8], from offset: Int) {
        let count = bytes.count - offset
        let requestSize = MemoryLayout<uv_write_t>.stride
        let memory = UnsafeMutableRawPointer.allocate(byteCount: requestSize + count, alignment: 16)
        bytes.withUnsafeBytes { raw in
            (memory + requestSize).copyMemory(from: raw.baseAddress! + offset, byteCount: count)
        }
        let request = memory.bindMemory(to: uv_write_t.self, capacity: 1)
        request.initialize(to: uv_write_t())
        request.pointee.data = UnsafeMutableRawPointer(bitPattern: count)
        var buf = uv_buf_init((memory + requestSize).assumingMemoryBound(to: CChar.self), UInt32(count))
        let rc = uv_write(request, stream, &buf, 1) { request, status in
            guard let request else { return }
            let count = Int(bitPattern: request.pointee.data)
            let handle = request.pointee.handle
            UnsafeMutableRawPointer(request).deallocate()
            LoopResource.withOwner(UnsafeMutableRawPointer(handle), as: TCPConnection.self) { connection in
                connection.writeQueueBytes -= count
                if status < 0 {
                    if status != UV_ECANCELED.rawValue { connection.handler?(.closed(UVError(code: status, operation: "write"))) }
                } else if connection.writeQueueBytes == 0 {
                    connection.handler?(.drained)
                }
            }
        }
        if rc < 0 {  // the callback will never run: release now
            memory.deallocate()
            return reportLater(UVError(code: rc, operation: "uv_write"))
        }
        writeQueueBytes += count
    }

    /// Tells the owner that writing failed, on the next loop turn (see ``writeFailure``).
    private func reportLater(_ error: UVError) {
        writeFailure = error
        guard let loop = stream.pointee.loop, let owner = loop.pointee.data,
              let timer = try? Timer(loop: Unmanaged<EventLoop>.fromOpaque(owner).takeUnretainedValue()) else {
            handler?(.closed(error))  // no timer to be had: the owner hears at once, as before
            return
        }
        failureReport = timer
        timer.start(after: 0) { [unowned self] in  // the timer is this connection's, cancelled when it closes
            failureReport?.cancel()
            failureReport = nil
            handler?(.closed(error))
        }
    }

    /// Closes gracefully (see ``Transport/closeAfterWrites()``): a TCP shutdown once queued writes have
    /// reached the kernel, input discarded until the peer's end of stream, then the close.
    public func closeAfterWrites() {
        guard !isClosing, !shutdownRequested else { return }
        shutdownRequested = true
        resumeReading()  // a paused connection must still see the peer finish
        let request = UnsafeMutablePointer<uv_shutdown_t>.allocate(capacity: 1)
        request.initialize(to: uv_shutdown_t())
        let rc = uv_shutdown(request, stream) { request, _ in
            guard let request else { return }
            let handle = request.pointee.handle
            request.deallocate()
            LoopResource.withOwner(UnsafeMutableRawPointer(handle), as: TCPConnection.self) { connection in
                connection.shutdownDone = true
                if connection.peerFinished { connection.finishClosing() }
            }
        }
        if rc < 0 {
            request.deallocate()
            finishClosing()
        }
    }

    /// The graceful close is over: the owner hears `.closed(nil)` once, then the handle goes.
    private func finishClosing() {
        guard !isClosing else { return }
        let handler = self.handler
        close()
        handler?(.closed(nil))
    }

    /// Closes now; queued writes are cancelled.
    public func closeNow() { close() }

    override func willClose() {
        handler = nil
        connectCompletion = nil
        failureReport?.cancel()
        failureReport = nil
    }
}
