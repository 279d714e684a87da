import SwitchboardCodec
import SwitchboardTransport

// What a bridge in another module needs to pace a producer by a channel's own flow control: the
// Combine bridge (SwitchboardServerCombine) feeds channels from publishers, and asks for values only as
// fast as the channel's producer queue, the loops' job order and each listener's readiness take them.
// Package access: these are the server's internals, shown to the bridge and to no user.

/// A stream handler told when a channel stops using it (removed or replaced), on each loop that held it:
/// the streams it ended that way do not call its `onCancel`.
package protocol RemovalObserving {
    func handlerWasRemoved()
}

extension EventChannel {
    /// How many values a producer may have on their way to the listeners at once: the producer queue's length.
    package var producerQueueLimit: Int { producerQueue.limit }

    /// Broadcasts `value` through the producer queue even on a loop thread, where ``broadcast(_:)`` would
    /// send it straight out, overtaking the values still waiting in the queue.
    package func enqueueBroadcast(_ value: ChannelValue) { enqueue(.data(value)) }

    /// Runs `body` on loop 0 behind every job queued before it there, the producer queue's hops included
    /// (so a value broadcast before has left the queue by then); false when the server has stopped.
    package func afterQueuedBroadcasts(_ body: @escaping @Sendable () -> Void) -> Bool {
        cores[0].loop.execute(body)
    }

    /// Ends every listener's stream, after an error event for `failure`, in a job on loop 0 behind the
    /// hops of values still in the producer queue; not through the queue, which keeps nothing after an
    /// end: a later handler's broadcasts must still get through. From there the end goes to each loop as
    /// a job of its own, behind the values loop 0 has passed on to it. Nothing ends if `isWithdrawn()`
    /// says then that the producer was removed meanwhile: a new handler's listeners are not its to end.
    package func endStreams(after failure: ChannelError?, unless isWithdrawn: @escaping @Sendable () -> Bool) {
        let name = self.name, cores = self.cores
        cores[0].loop.execute {  // queued even on loop 0, behind the hops of values still in the queue
            guard !isWithdrawn() else { return }
            if let failure { cores[0].value.broadcast(on: name, .error(failure)) }
            cores.onEveryLoop { $0.endListeners(on: name) }
        }
    }
}

extension EventSink {
    /// The loop of the sink's connection, from any thread.
    package var loop: LoopHandle { target.loop }
}
