import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardWire

/// What a reload takes away (protocol/plugins.md, "Security model"): rights are checked when a request
/// is made, but holding a channel and listening to a stream outlast the request that began them. When
/// the gates' settings change (``Pipeline/gateEpoch``), every registration and stream is judged again by
/// the gates, as the REGISTER or `listen` that began it would be now; what they refuse is taken away.
extension ServerCore {
    /// Judges again, once per change of the gates' settings, every channel held and every stream
    /// listened to on this loop (from the housekeeping timer, so within its interval of a reload).
    func judgeHoldingsAgain() {
        let epoch = pipeline.gateEpoch.value
        guard epoch != holdingsJudgedAt else { return }
        holdingsJudgedAt = epoch
        for registration in Array(directory.registrations.values) { _ = revokeIfRefused(registration, epoch: epoch) }
        for connection in Array(connections.values) where connection.hasPlugins {
            for stream in Array(connection.streams.values) {
                guard let rejection = refusal(of: .listen, on: stream.entry.name, for: connection) else { continue }
                endRevoked(stream, of: connection, rejection)
            }
        }
    }

    /// Whether `registration` was taken away now: once per change of the gates' settings, before a
    /// request reaches its holder, so that none does after the reload that revoked it.
    func revokeIfRefused(_ registration: Registration, epoch: Int) -> Bool {
        guard registration.judgedEpoch != epoch else { return false }
        registration.judgedEpoch = epoch
        guard registration.holder.hasPlugins,
              let rejection = refusal(of: .register, on: registration.name, for: registration.holder) else { return false }
        registration.holder.logger.notice("a reload took away a channel it held", metadata: ["channel": "\(registration.name)"])
        revoke(registration)
        registration.holder.writeError(.plugin(code: rejection.code,
                                               message: "\(registration.name) is no longer yours to hold: \(rejection.error.message)",
                                               details: .stringMap(["channel": .string(registration.name)])))
        return true
    }

    /// The first gate's refusal of `kind` on `channel` for `connection`, as a request would get it now.
    private func refusal(of kind: InboundKind, on channel: String, for connection: Connection) -> Rejection? {
        for stage in pipeline.inbound where stage.sees(channel, kind) {
            if case .refuse(let rejection) = stage.gate?.judge(connection.context, channel: channel, kind: kind) { return rejection }
        }
        return nil
    }

    /// Ends a stream the gates no longer allow: its handler is told, as on a cancel, and the listener
    /// gets an error event with the refusal's code, then the end.
    private func endRevoked(_ stream: EventStream, of connection: Connection, _ rejection: Rejection) {
        let name = stream.entry.name
        connection.logger.notice("a reload ended a stream", metadata: ["channel": "\(name)"])
        connection.endStream(stream, notifyHandler: true)
        let channel = connection.context.listenedName(of: name) ?? name  // the name the client used
        let codec = stream.entry.codec
        connection.writeEvent(OutboundEvent(channel: channel, content: .error(ChannelError(code: rejection.code, message: rejection.error.message)),
                                            codec: codec))
        connection.writeEvent(OutboundEvent(channel: channel, content: .end, codec: codec))
    }
}
