#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// A blocking TCP socket on loopback, for tests that speak raw bytes to a live server's port.
public final class RawSocket {
    private var fd: Int32

    /// Connects to `host:port` (an IPv4 address of this machine: loopback by default); reads give up
    /// after `timeout` seconds. Nil if the connection fails.
    public init?(host: String = "127.0.0.1", port: Int, timeout: Double = 5) {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)  // no child process inherits it
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr(host)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { close(fd); return nil }
        var limit = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - timeout.rounded(.down)) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { if fd >= 0 { close(fd) } }

    /// An IPv4 address of this machine other than loopback, if it has one: a peer connecting from it is
    /// not a loopback client.
    public static let nonLoopbackAddress: String? = {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return nil }
        defer { freeifaddrs(list) }
        var entry = list
        while let current = entry {
            defer { entry = current.pointee.ifa_next }
            guard let address = current.pointee.ifa_addr, address.pointee.sa_family == sa_family_t(AF_INET) else { continue }
            let ipv4 = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
            guard UInt32(bigEndian: ipv4.s_addr) >> 24 != 127 else { continue }
            return String(cString: inet_ntoa(ipv4))
        }
        return nil
    }()

    /// Closes abruptly: the peer gets a reset (RST), not an end of stream.
    public func reset() {
        guard fd >= 0 else { return }
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        close(fd)
        fd = -1
    }

    public func send(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    public func send(_ text: String) { send(Array(text.utf8)) }

    /// Up to `count` bytes, waiting for at least one; empty once the server has closed or the wait ran out.
    public func read(upTo count: Int = 65_536) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return n > 0 ? Array(buffer[0..<n]) : []
    }

    /// Exactly `count` bytes, or fewer if the server closes or the wait runs out.
    public func read(exactly count: Int) -> [UInt8] {
        var out: [UInt8] = []
        while out.count < count {
            let more = read(upTo: count - out.count)
            if more.isEmpty { break }
            out += more
        }
        return out
    }

    /// Everything until the server closes: the bytes and the seconds it took; nil if it did not close
    /// before the wait ran out.
    public func readUntilClosed() -> (bytes: [UInt8], seconds: Double)? {
        let start = Date()
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 { out += buffer[0..<n]; continue }
            return n == 0 ? (out, Date().timeIntervalSince(start)) : nil
        }
    }
}
