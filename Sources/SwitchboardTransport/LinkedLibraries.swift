import CLibUV
import COpenSSL

/// The versions of the C libraries this process runs with (for `switchboard --version`): those loaded,
/// which may be newer than those built against.
package enum LinkedLibraries {
    /// libuv's, as `uv_version_string()` gives it ("1.48.0").
    package static var libuv: String { String(cString: uv_version_string()) }
    /// OpenSSL's, as `OpenSSL_version(OPENSSL_VERSION)` gives it ("OpenSSL 3.0.15 3 Sep 2024").
    package static var openSSL: String { String(cString: OpenSSL_version(OPENSSL_VERSION)) }
}
