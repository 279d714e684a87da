/// What a client puts over its TCP connection: TLS (checking the server's name), then a WebSocket.
public struct ClientLayers {
    /// TLS with this context, if any.
    public var tls: TLSContext?
    /// The name the server's certificate must carry, and the WebSocket request's `Host`.
    public var serverName: String
    public var webSocket: Bool

    public init(tls: TLSContext?, serverName: String, webSocket: Bool) {
        self.tls = tls
        self.serverName = serverName
        self.webSocket = webSocket
    }

    /// `connection` with the layers over it; throws if TLS cannot start (the caller closes it).
    public func wrap(_ connection: any Transport, loop: EventLoop) throws -> any Transport {
        var transport = connection
        if let tls { transport = try TLSTransport(over: transport, context: tls, serverName: serverName, loop: loop) }
        if webSocket { transport = WebSocketClientTransport(over: transport, host: serverName) }
        return transport
    }

    /// `tcp`, `tls`, `ws` or `wss`.
    public var scheme: String { webSocket ? (tls == nil ? "ws" : "wss") : (tls == nil ? "tcp" : "tls") }
}
