/// The `# HELP` lines of `GET /metrics`. The counters reach the Prometheus registry through swift-metrics,
/// whose factory API has no help text (swift-prometheus registers them with none, and refuses a second
/// registration of a name with different help), so the help is added to the text as it is served: before
/// each family's `# TYPE` line, from this table.
enum MetricsHelp {
    static let texts: [String: String] = [
        "switchboard_connections": "Open client connections.",
        "switchboard_replies_pending": "Requests received and not yet answered.",
        "switchboard_registrations": "Channels held by clients (broker registrations).",
        "switchboard_uptime_seconds": "Seconds since the server started.",
        "switchboard_connections_total": "Client connections accepted.",
        "switchboard_frames_in_total": "Frames and text lines received.",
        "switchboard_frames_out_total": "Frames and text lines sent.",
        "switchboard_bytes_in_total": "Bytes received.",
        "switchboard_bytes_out_total": "Bytes sent.",
        "switchboard_slow_consumers_closed_total": "Connections closed for staying over the outbound limit.",
        "switchboard_ignored_frames_total": "Frames ignored (answers nobody waited for, frames a client may not send).",
        "switchboard_forwarded_requests_total": "Requests forwarded to a client that holds the channel.",
        "switchboard_accept_errors_total": "Connections that could not be accepted.",
        "switchboard_events_dropped_total": "Events dropped, by reason (none is lost uncounted).",
        "switchboard_closes_total": "Connections closed, by reason.",
        "switchboard_plugin_rejections_total": "Requests refused by a plugin, by plugin and code.",
        "switchboard_plugin_failures_total": "Plugin stages that failed, by plugin.",
        "switchboard_channel_requests_total": "Requests per channel (channels past the label limit summed as other).",
        "switchboard_channel_events_total": "Events per event channel (channels past the label limit summed as other).",
        "switchboard_sessions_live": "Resumable sessions with a connection (protocol/resumption.md).",
        "switchboard_sessions_parked": "Resumable sessions whose connection was lost, kept for their time to live.",
        "switchboard_session_buffered_bytes": "Bytes kept for sessions: sent and not acknowledged, and made while parked.",
        "switchboard_sessions_made_total": "Resumable sessions granted.",
        "switchboard_sessions_resumed_total": "Sessions resumed by a resuming HELLO.",
        "switchboard_sessions_taken_total": "Sessions taken from a connection that still carried them.",
        "switchboard_sessions_ended_total": "Sessions ended, by reason.",
        "switchboard_resumes_refused_total": "Resuming HELLOs answered cannot_resume, by reason.",
        "switchboard_session_frames_dropped_total": "Frames others sent for a session that had no room for them, by kind.",
    ]

    /// The help of a family: the table's, or for the cluster's counters (named after their keys in
    /// `switchboard/stats`) a pointer there.
    static func help(for family: Substring) -> String {
        texts[String(family)] ?? "The \(family.dropFirst("switchboard_".count)) counter of switchboard/stats (protocol/cluster.md)."
    }

    /// `exposition` with a `# HELP` line before every `# TYPE` line that has none.
    static func adding(to exposition: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(exposition.count + 2048)
        var lastHelped: Substring?
        for line in String(decoding: exposition, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false) {
            let words = line.split(separator: " ")
            if words.count >= 3, words[0] == "#", words[1] == "HELP" { lastHelped = words[2] }
            if words.count >= 3, words[0] == "#", words[1] == "TYPE", lastHelped != words[2] {
                out.append(contentsOf: "# HELP \(words[2]) \(help(for: words[2]))\n".utf8)
            }
            out.append(contentsOf: line.utf8)
            out.append(UInt8(ascii: "\n"))
        }
        out.removeLast()  // the split's last piece had no newline after it
        return out
    }
}
