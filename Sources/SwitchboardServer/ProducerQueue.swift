import Synchronization
import SwitchboardCodec
import SwitchboardTransport

/// Events posted from threads other than the loop's, waiting for their hop onto it: one channel's
/// broadcasts, or one listener's sink. Bounded, under the channel's overflow policy, with every drop
/// counted; and coalesced, so a burst costs one cross-thread job however many events it holds.
///
/// A producer thread never blocks and never grows memory without bound: past `limit` waiting events
/// the channel's policy decides which event goes (the oldest, the new one, or all but the newest), and
/// the loop adds each drop to stats as `eventsDropped.producerQueueFull`. An end of stream is never
/// dropped; nothing after it is kept (the stream is over).
///
/// Order: an event joins the batch of the hop already queued only while no other job has been queued
/// since that hop; otherwise it starts a batch with a hop of its own. So from one thread, events keep
/// their place among its other loop-bound calls (answers, other channels), not just among themselves.
final class ProducerQueue: Sendable {
    private struct State: ~Copyable {
        /// Waiting events in batches, oldest first; each batch is taken by one hop.
        var batches: [[EventContent]] = []
        var count = 0
        /// The job number of the last batch's hop, while events may still join that batch.
        var openHop: UInt64?
        var dropped = 0
        var hasEnd = false
    }

    private let state = Mutex(State())
    /// How many events may wait.
    let limit: Int
    private let overflow: OverflowPolicy
    private let loop: LoopHandle

    init(limit: Int, overflow: OverflowPolicy, loop: LoopHandle) {
        self.limit = max(1, limit)
        self.overflow = overflow
        self.loop = loop
    }

    /// Adds `content` and makes sure a hop will deliver it: `hop` (which must ``take()``) is queued
    /// when the event starts a batch.
    func add(_ content: EventContent, hop: @escaping @Sendable () -> Void) {
        let startsBatch = state.withLock { s -> Bool in
            guard !s.hasEnd else { return false }  // after the end, as on the loop, events go nowhere
            if case .end = content {
                s.hasEnd = true
            } else if s.count >= limit {
                switch overflow {
                case .dropNewest:
                    s.dropped += 1
                    return false
                case .dropOldest:
                    let index = s.batches.firstIndex { !$0.isEmpty }!
                    s.batches[index].removeFirst()
                    s.count -= 1
                    s.dropped += 1
                case .keepLatest:
                    s.dropped += s.count
                    for index in s.batches.indices { s.batches[index].removeAll() }  // their hops still come
                    s.count = 0
                }
            }
            s.count += 1
            if let open = s.openHop, open == loop.acceptedJobs, !s.batches.isEmpty {
                s.batches[s.batches.count - 1].append(content)
                return false
            }
            s.batches.append([content])
            s.openHop = nil
            return true
        }
        guard startsBatch, let number = loop.enqueue(hop) else { return }
        state.withLock { s in if !s.batches.isEmpty { s.openHop = number } }
    }

    /// On the loop: the oldest batch, and how many events were dropped since the last take.
    func take() -> (events: [EventContent], dropped: Int) {
        state.withLock { s in
            let events = s.batches.isEmpty ? [] : s.batches.removeFirst()
            s.count -= events.count
            if s.batches.isEmpty { s.openHop = nil }
            defer { s.dropped = 0 }
            return (events, s.dropped)
        }
    }
}
