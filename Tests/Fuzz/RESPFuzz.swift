// libFuzzer entry for the RESP2 reply parser (compiled by Tests/Fuzz/run.sh together with
// Sources/BearerdProxyCore/RESP.swift): the replies of a Redis server bearerd does not trust
// (docs/architecture.md §6.13). Oracle: no crash, no trap, no hang, and the same replies (or the
// same error) whether the bytes arrive whole or split at a point the input chooses.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRESP(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 1 else { return 0 }
    let control = Int(data[0])
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    var limits = RESPLimits()
    // Small bounds as well as the defaults, so the limits themselves are reached.
    if control & 1 == 1 {
        limits.maxBulkBytes = 64
        limits.maxArrayLength = 8
        limits.maxDepth = 3
        limits.maxLineBytes = 32
        limits.maxReplyBytes = 256
    }
    let whole = run([bytes[...]], limits)
    let cut = bytes.isEmpty ? 0 : (control >> 1) % (bytes.count + 1)
    let split = run([bytes[..<cut], bytes[cut...]], limits)
    precondition(whole == split, "split input parsed differently")
    // Encoding round trip: a command's bytes parse back as an array of its bulk strings.
    let args = bytes.split(separator: 0x20, maxSplits: 6).map { Array($0) }
    var p = RESPParser()
    p.feed(RESP.command(args))
    let back = try? p.next()
    precondition(back == .array(args.map { .bulk($0) }), "command round trip")
    return 0
}

private func run(_ chunks: [ArraySlice<UInt8>], _ limits: RESPLimits) -> [String] {
    var parser = RESPParser(limits: limits)
    var out: [String] = []
    for chunk in chunks {
        parser.feed(Array(chunk))
        var rounds = 0
        while rounds < 10_000 {
            rounds += 1
            do {
                guard let v = try parser.next() else { break }
                out.append("\(v)")
            } catch {
                out.append("error")
                return out
            }
        }
    }
    return out
}
