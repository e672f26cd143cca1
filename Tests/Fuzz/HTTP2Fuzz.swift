// libFuzzer entry for the HTTP/2 engine (compiled by Tests/Fuzz/run.sh with Sources/BearerdHTTP2
// and BearerdHTTP as a separate module, not by SwiftPM). Frames from the fuzzer go, after the
// client connection preface, into a server-side `HTTP2Session`, split in two feeds at a point the
// first byte picks. Every request the engine reports is mapped with `HTTP2HeaderMapping` and
// answered (head, a body chunk, trailers), so the sending side and the data source run too.
// Oracle: no crash, no sanitizer report; errors are expected and fine.
import BearerdHTTP

let preface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    guard size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let split = min(Int(input[0]), input.count - 1)
    let body = Array(input[1...])
    var settings = HTTP2Settings()
    settings.maxHeaderListSize = 4096
    settings.enableConnectProtocol = input[0] & 1 == 1
    // The listener's own rules on top of nghttp2: small limits so the fuzzer reaches them
    // (refused streams, 431 heads, the reset budget ending the connection).
    settings.maxConcurrentStreams = input[0] & 2 == 2 ? 2 : 128
    settings.maxHeaderCount = input[0] & 4 == 4 ? 3 : 100
    settings.streamResetBudget = StreamResetBudget(limit: input[0] & 8 == 8 ? 1 : 200, windowNanos: 10_000_000_000)
    guard let session = try? HTTP2Session(role: .server, settings: settings) else { return 0 }
    var out: [UInt8] = []
    for piece in [preface + body.prefix(split), Array(body.dropFirst(split))] where !piece.isEmpty {
        do {
            try piece.withUnsafeBytes { try session.receive($0, now: UInt64(input.count)) }
        } catch {
            _ = try? session.produce(into: &out)
            return 0
        }
        for event in session.takeEvents() {
            switch event {
            case .headers(let id, let fields, .request, _):
                if let r = try? HTTP2HeaderMapping.request(from: fields) {
                    _ = HTTP2HeaderMapping.requestFields(r.head, scheme: r.scheme, authority: r.head.headers["Host"] ?? "")
                }
                try? session.submitResponse(stream: id, [HTTPField(name: ":status", value: "200")], endStream: false)
                [UInt8](repeating: 0x61, count: Int(id & 0xFF)).withUnsafeBytes { session.sendData(stream: id, $0) }
                session.endStream(stream: id, trailers: id & 1 == 1 ? [HTTPField(name: "grpc-status", value: "0")] : nil)
            case .headers(_, let fields, _, _):
                _ = try? HTTP2HeaderMapping.trailers(from: fields)
                _ = try? HTTP2HeaderMapping.responseHead(from: fields)
            case .data(let id, let bytes, _):
                session.consumed(stream: id, count: bytes.count)
            case .requestHeadRefused(let id, _, _):
                // What the listener does: 431, then the stream ends.
                try? session.submitResponse(stream: id, [HTTPField(name: ":status", value: "431")], endStream: false)
                session.endStream(stream: id, trailers: nil, resetAfter: .noError)
            default:
                break
            }
        }
        out.removeAll(keepingCapacity: true)
        _ = try? session.produce(into: &out)
        _ = session.takeEvents()
    }
    return 0
}
