import Synchronization
import SwitchboardTransport

/// The caps on connections served at once (``ServerConfiguration/maxConnections`` and
/// ``ServerConfiguration/maxConnectionsPerAddress``), shared by every loop: loop 0 admits each
/// connection it accepts, and the loop that serves it releases it when it closes.
final class ConnectionQuota: Sendable {
    /// Why a connection was refused; counted in stats as its close reason.
    enum Refusal: String {
        /// The server serves ``maxConnections`` already.
        case overConnectionLimit
        /// Its address has ``maxPerAddress`` connections already.
        case overAddressLimit
    }

    private struct State {
        var total = 0
        /// Connections by host, for the hosts the per-address cap applies to.
        var byHost: [String: Int] = [:]
        /// Parked sessions by host (counted in ``byHost`` too): a host may go past its cap by as many, to
        /// resume them (protocol/resumption.md, "Limits").
        var parkedByHost: [String: Int] = [:]
    }

    private let state = Mutex(State())
    /// The total cap: the configured one, lowered to the descriptor limit less what the server keeps for
    /// itself (64, or a quarter of a smaller limit: the listeners, the loops' own handles, a cluster's
    /// sockets, files), so that accepting never runs out of descriptors.
    let maxConnections: Int
    let maxPerAddress: Int
    let capsLoopback: Bool

    init(_ config: ServerConfiguration) {
        let descriptors = ProcessLimits.openFiles ?? Int.max
        maxConnections = max(1, min(config.maxConnections, descriptors - min(64, descriptors / 4)))
        maxPerAddress = config.maxConnectionsPerAddress
        capsLoopback = config.capsLoopback
    }

    /// Counts a connection from `host`, telling whether it came past the address's cap by the margin its
    /// parked sessions give (it may then only resume one); the refusal instead, when a cap is reached.
    func admit(_ host: String) -> (refusal: Refusal?, toResume: Bool) {
        let capped = capsLoopback || !isLoopbackAddress(host)
        return state.withLock { state in
            guard state.total < maxConnections else { return (.overConnectionLimit, false) }
            var toResume = false
            if capped {
                let count = state.byHost[host, default: 0]
                guard count < maxPerAddress + state.parkedByHost[host, default: 0] else { return (.overAddressLimit, false) }
                toResume = count >= maxPerAddress
                state.byHost[host] = count + 1
            }
            state.total += 1
            return (nil, toResume)
        }
    }

    /// A session of a connection from `host` is parked (`true`), or no longer (`false`).
    func setParked(_ isParked: Bool, host: String) {
        state.withLock { state in
            let count = state.parkedByHost[host, default: 0] + (isParked ? 1 : -1)
            state.parkedByHost[host] = count > 0 ? count : nil
        }
    }

    /// A connection from `host` that ``admit(_:)`` counted has gone.
    func release(_ host: String) {
        state.withLock { state in
            state.total -= 1
            guard let count = state.byHost[host] else { return }
            state.byHost[host] = count > 1 ? count - 1 : nil
        }
    }
}
