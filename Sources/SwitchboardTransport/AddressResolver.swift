import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// A socket address: IPv4 or IPv6, with its port.
public struct SocketAddress: Sendable, CustomStringConvertible {
    fileprivate var storage = sockaddr_storage()

    /// `host:port`, or `[host]:port` for IPv6.
    public var description: String {
        var copy = storage
        return withUnsafeBytes(of: &copy) { bytes -> String in
            var name = [CChar](repeating: 0, count: 64)
            if storage.ss_family == sa_family_t(AF_INET6) {
                let v6 = bytes.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)
                uv_ip6_name(v6, &name, name.count)
                return "[\(String(cString: name))]:\(UInt16(bigEndian: v6.pointee.sin6_port))"
            }
            let v4 = bytes.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)
            uv_ip4_name(v4, &name, name.count)
            return "\(String(cString: name)):\(UInt16(bigEndian: v4.pointee.sin_port))"
        }
    }

    /// Runs `body` with the address as libuv takes it.
    func withSockaddr<Result>(_ body: (UnsafePointer<sockaddr>) -> Result) -> Result {
        var copy = storage
        return withUnsafeBytes(of: &copy) { body($0.baseAddress!.assumingMemoryBound(to: sockaddr.self)) }
    }

    /// The literal address `host` (IPv4, or IPv6 with or without brackets) with `port`; nil for a name.
    init?(literal host: String, port: Int) {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        let parsed = withUnsafeMutableBytes(of: &storage) { bytes -> Bool in
            if uv_ip4_addr(bare, Int32(port), bytes.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)) == 0 { return true }
            return uv_ip6_addr(bare, Int32(port), bytes.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)) == 0
        }
        guard parsed else { return nil }
    }

    /// The address `read` writes (as `getpeername` does, given room and its size); nil if it fails.
    init?(reading read: (UnsafeMutablePointer<sockaddr>, UnsafeMutablePointer<Int32>) -> Int32) {
        var length = Int32(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutableBytes(of: &storage) { read($0.baseAddress!.assumingMemoryBound(to: sockaddr.self), &length) }
        guard rc == 0 else { return nil }
    }

    fileprivate init(_ address: UnsafePointer<sockaddr>, length: Int) {
        withUnsafeMutableBytes(of: &storage) { bytes in
            bytes.copyMemory(from: UnsafeRawBufferPointer(start: address, count: min(length, bytes.count)))
        }
    }
}

/// Turns a host (a name such as `localhost`, an IPv4 literal, or an IPv6 literal with or without
/// brackets) into the addresses to try, in the order the system gives them: a literal at once, a name
/// through `getaddrinfo` (libuv's thread pool when asynchronous).
public enum AddressResolver {
    /// Resolves `host` for TCP to `port`; `completion` runs on the loop (at once for a literal).
    public static func resolve(loop: EventLoop, host: String, port: Int,
                               _ completion: @escaping (Result<[SocketAddress], UVError>) -> Void) {
        if let literal = SocketAddress(literal: host, port: port) { return completion(.success([literal])) }
        guard (0...65_535).contains(port) else { return completion(.failure(UVError(code: -EINVAL, operation: "resolve \(host):\(port)"))) }
        let request = UnsafeMutablePointer<uv_getaddrinfo_t>.allocate(capacity: 1)
        request.initialize(to: uv_getaddrinfo_t())
        let lookup = Lookup(host: host, port: port, completion: completion)
        request.pointee.data = Unmanaged.passRetained(lookup).toOpaque()
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        let rc = uv_getaddrinfo(loop.loop, request, { request, status, result in
            guard let request else { return }
            let lookup = Unmanaged<Lookup>.fromOpaque(request.pointee.data).takeRetainedValue()
            request.deallocate()
            defer { if let result { uv_freeaddrinfo(result) } }
            lookup.completion(Self.addresses(result, status: status, host: lookup.host, port: lookup.port))
        }, host, String(port), &hints)
        if rc != 0 {  // the callback will never run
            Unmanaged<Lookup>.fromOpaque(request.pointee.data).release()
            request.deallocate()
            completion(.failure(UVError(code: rc, operation: "resolve \(host):\(port)")))
        }
    }

    /// Resolves `host` for a listener on `port`, blocking (at start-up).
    public static func resolveNow(loop: EventLoop, host: String, port: Int) throws(UVError) -> [SocketAddress] {
        if let literal = SocketAddress(literal: host, port: port) { return [literal] }
        var request = uv_getaddrinfo_t()
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        let rc = uv_getaddrinfo(loop.loop, &request, nil, host, String(port), &hints)  // no callback: at once
        defer { if let result = request.addrinfo { uv_freeaddrinfo(result) } }
        return try addresses(request.addrinfo, status: rc, host: host, port: port).get()
    }

    private final class Lookup {
        let host: String
        let port: Int
        let completion: (Result<[SocketAddress], UVError>) -> Void

        init(host: String, port: Int, completion: @escaping (Result<[SocketAddress], UVError>) -> Void) {
            self.host = host
            self.port = port
            self.completion = completion
        }
    }

    private static func addresses(_ list: UnsafeMutablePointer<addrinfo>?, status: Int32, host: String,
                                  port: Int) -> Result<[SocketAddress], UVError> {
        guard status == 0 else { return .failure(UVError(code: status, operation: "resolve \(host)")) }
        var addresses: [SocketAddress] = []
        var node = list
        while let entry = node {
            if let address = entry.pointee.ai_addr,
               entry.pointee.ai_family == AF_INET || entry.pointee.ai_family == AF_INET6 {
                addresses.append(SocketAddress(address, length: Int(entry.pointee.ai_addrlen)))
            }
            node = entry.pointee.ai_next
        }
        guard !addresses.isEmpty else { return .failure(UVError(code: -ENOENT, operation: "resolve \(host): no address")) }
        return .success(addresses)
    }
}
