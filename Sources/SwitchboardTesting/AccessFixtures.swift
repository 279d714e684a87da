import SwitchboardPlugins
import SwitchboardTransport
import SwitchboardWire

// Tokens and rights shared by the tests of access control (SwitchboardPluginsTests) and of what the
// server's endpoints let each user do (SwitchboardServerTests).

/// A HELLO frame with `token`.
package func hello(token: String, id: UInt32 = 1) -> Frame {
    Frame(.hello, id: id, payload: Array(#"{"version":1,"token":"\#(token)"}"#.utf8))
}

/// The SHA-256 of `token` in hexadecimal, as an access rule's `tokenSha256` holds it.
package func sha(_ token: String) -> String { Digest.sha256Hex(Array(token.utf8)) }

/// Rights used by the access-control tests.
package func accessRules() -> AccessRules {
    AccessRules(
        users: [
            .init(name: "alice", tokenSha256: sha("alice-token"),
                  allow: .init(call: ["switchboard/*"], listen: ["switchboard/room"], register: ["held/*"]),
                  deny: .init(call: ["switchboard/stats"])),
            .init(name: "bob", tokenSha256: sha("bob-token").uppercased()),
        ],
        anonymous: .init(allow: .init(call: ["switchboard/echo"], listen: [], send: [], register: [])))
}
