/// The console page that the server answers `GET /` with (wire-v1 section 8), compiled into the binary.
///
/// The page (`clients/console/index.html`) imports the JavaScript client (`clients/js/client.js`),
/// which imports its codec (`clients/js/codec.js`). The server answers no other path, so the
/// modules travel inside the page: each import specifier is replaced by a `data:` URL holding the
/// module, innermost first. The files stay plain ES modules that Node and a static file server load
/// as they are.
public enum ConsolePage {
    /// The page's bytes, composed once.
    public static let html: [UInt8] = {
        let codec = dataURL(PackageResources.codec_js)
        let client = dataURL(replacing("'./codec.js'", with: "'\(codec)'", in: PackageResources.client_js))
        return replacing("'../js/client.js'", with: "'\(client)'", in: PackageResources.index_html)
    }()

    /// A JavaScript module as a `data:` URL, percent-encoded so that it can sit in a quoted JS string
    /// inside an HTML script element.
    static func dataURL(_ module: [UInt8]) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var url = Array("data:text/javascript;charset=utf-8,".utf8)
        url.reserveCapacity(url.count + module.count * 2)
        for byte in module {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."),
                 UInt8(ascii: "("), UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: "/"), UInt8(ascii: ":"),
                 UInt8(ascii: ";"), UInt8(ascii: ","), UInt8(ascii: "="), UInt8(ascii: "+"), UInt8(ascii: "{"),
                 UInt8(ascii: "}"), UInt8(ascii: "["), UInt8(ascii: "]"):
                url.append(byte)
            default:
                url += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            }
        }
        return String(decoding: url, as: UTF8.self)
    }

    /// `text` with every occurrence of `pattern` replaced; a page or module without it is a build
    /// mistake that the console tests catch (the page would not load its client).
    static func replacing(_ pattern: String, with replacement: String, in text: [UInt8]) -> [UInt8] {
        let needle = Array(pattern.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(text.count + replacement.utf8.count)
        var index = 0
        while index < text.count {
            if text[index] == needle[0], index + needle.count <= text.count,
               text[index..<index + needle.count].elementsEqual(needle) {
                out += replacement.utf8
                index += needle.count
            } else {
                out.append(text[index])
                index += 1
            }
        }
        return out
    }
}
