import Synchronization
import SwitchboardCodec

/// Events posted from threads other than the loop's, waiting for their hop onto it: one channel's
/// broadcasts, or one listener's sink. Bounded, under the channel's overflow policy, with every drop
/// counted; and coalesced, so a burst costs one cross-thread job however many events it holds.
///
/// A producer thread never blocks and never grows memory without bound: past `limit` waiting events
/// the channel's policy decides which event goes (the oldest, the new one, or all but the newest), and
/// the loop adds each drop to stats as `eventsDropped.producerQueueFull`.
final class ProducerQueue: Sendable {
    private struct State: ~Copyable {
        var events: [EventContent] = []
        var dropped = 0
        var hopScheduled = false
    }

    private let state = Mutex(State())
    private let limit: Int
    private let overflow: OverflowPolicy

    init(limit: Int, overflow: OverflowPolicy) {
        self.limit = max(1, limit)
        self.overflow = overflow
    }

    /// Adds `content`; true when the caller must schedule the hop that will ``take()`` it.
    func add(_ content: EventContent) -> Bool {
        state.withLock { s in
            if s.events.count >= limit {
                switch overflow {
                case .dropNewest:
                    s.dropped += 1
                    return false
                case .dropOldest:
                    s.events.removeFirst()
                    s.dropped += 1
                case .keepLatest:
                    s.dropped += s.events.count
                    s.events.removeAll(keepingCapacity: true)
                }
            }
            s.events.append(content)
            defer { s.hopScheduled = true }
            return !s.hopScheduled
        }
    }

    /// On the loop: everything waiting, and how many events were dropped since the last take.
    func take() -> (events: [EventContent], dropped: Int) {
        state.withLock { s in
            defer {
                s.events = []
                s.dropped = 0
                s.hopScheduled = false
            }
            return (s.events, s.dropped)
        }
    }
}
