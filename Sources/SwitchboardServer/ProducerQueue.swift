import Synchronization
import SwitchboardCodec

/// Events posted from threads other than the loop's, waiting for their hop onto it: one channel's
/// broadcasts, or one listener's sink. Bounded, under the channel's overflow policy, with every drop
/// counted; and coalesced, so a burst costs one cross-thread job however many events it holds.
///
/// A producer thread never blocks and never grows memory without bound: past `limit` waiting events
/// the channel's policy decides which event goes (the oldest, the new one, or all but the newest), and
/// the loop adds each drop to stats as `eventsDropped.producerQueueFull`. An end of stream is never
/// dropped; nothing after it is kept (the stream is over).
final class ProducerQueue: Sendable {
    private struct State: ~Copyable {
        /// Waiting events are `events[head...]`: dropping the oldest moves `head` instead of shifting.
        var events: [EventContent] = []
        var head = 0
        var dropped = 0
        var hopScheduled = false
        var hasEnd = false
        var count: Int { events.count - head }
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
            guard !s.hasEnd else { return false }  // after the end, as on the loop, events go nowhere
            if case .end = content {
                s.hasEnd = true
            } else if s.count >= limit {
                switch overflow {
                case .dropNewest:
                    s.dropped += 1
                    return false
                case .dropOldest:
                    s.head += 1
                    s.dropped += 1
                    if s.head * 2 > s.events.count {
                        s.events.removeFirst(s.head)
                        s.head = 0
                    }
                case .keepLatest:
                    s.dropped += s.count
                    s.events.removeAll(keepingCapacity: true)
                    s.head = 0
                }
            }
            s.events.append(content)
            defer { s.hopScheduled = true }
            return !s.hopScheduled
        }
    }

    /// On the loop: everything waiting, and how many events were dropped since the last take.
    func take() -> (events: ArraySlice<EventContent>, dropped: Int) {
        state.withLock { s in
            defer {
                s.events = []
                s.head = 0
                s.dropped = 0
                s.hopScheduled = false
            }
            return (s.events[s.head...], s.dropped)
        }
    }
}
