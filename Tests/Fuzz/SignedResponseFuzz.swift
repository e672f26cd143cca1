// libFuzzer entry for the classifier of answers to signed requests (compiled by Tests/Fuzz/run.sh
// together with Sources/BearerdProxyCore/SignedResponseVerdict.swift): status, header fields and
// body from an upstream bearerd does not trust. Oracle: no crash, no trap, no hang; a status below
// 400 is never an error; a rejection only with 400/403; every code is 1–128 bytes of
// `A–Z a–z 0–9 . _ -`; a canonical-request hash is 64 lower-case hex digits; white space after
// the document changes nothing; the time parsers agree with a re-formatted IMF-fixdate.

func codeIsClean(_ c: String) -> Bool {
    !c.isEmpty && c.utf8.count <= 128 && c.utf8.allSatisfy(SignedResponseVerdict.isCodeByte)
}

func check(_ v: SignedResponseVerdict, status: Int) {
    switch v {
    case .notAnError: precondition(status < 400, "notAnError for an error status")
    case .credentialsRejected(let c): precondition(status == 400 || status == 403, "rejection with \(status)"); precondition(codeIsClean(c))
    case .clockSkew(let c, _): precondition(status >= 400); precondition(codeIsClean(c))
    case .signatureMismatch(let c, let h):
        precondition(status >= 400); precondition(codeIsClean(c))
        if let h { precondition(h.utf8.count == 64 && h.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) }
    case .otherError(let c): precondition(status >= 400); if let c { precondition(codeIsClean(c)) }
    }
}

func imf(_ t: Int64) -> String {
    // Civil from days (H. Hinnant), for t in 0...253402300799.
    let days = t / 86_400, secs = t % 86_400
    let z = days + 719_468, era = z / 146_097, doe = z - era * 146_097
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153
    let d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9, y = yoe + era * 400 + (m <= 2 ? 1 : 0)
    func two(_ v: Int64) -> String { v < 10 ? "0\(v)" : "\(v)" }
    var year = "\(y)"; while year.utf8.count < 4 { year = "0" + year }
    let wd = HTTPTime.weekdays[Int((days + 3) % 7)]   // 1970-01-01 was a Thursday
    return "\(wd), \(two(d)) \(HTTPTime.months[Int(m - 1)]) \(year) \(two(secs / 3600)):\(two(secs / 60 % 60)):\(two(secs % 60)) GMT"
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSignedResponse(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 2 else { return 0 }
    let statuses = [200, 204, 301, 304, 400, 401, 403, 404, 409, 500, 503, 0, -1, 999]
    let status = statuses[Int(data[0]) % statuses.count]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    // The first line, if the control byte asks, is a header field value; the rest the body.
    var body = bytes
    var headers: [(name: String, value: String)] = []
    if data[0] & 0x80 != 0, let nl = bytes.firstIndex(of: 0x0A) {
        let value = String(decoding: bytes[..<nl], as: UTF8.self)
        let names = ["x-amz-error-code", "X-Amzn-ErrorType", "x-amzn-query-error", "x-oss-ec", "Date"]
        headers = [(names[Int(data[0] >> 4) % names.count], value), ("Date", value)]
        body = Array(bytes[(nl + 1)...])
        _ = HTTPTime.parseISO8601(value)
        if let t = HTTPTime.parseIMFFixdate(value) {
            precondition(t >= -62_135_596_800 && t <= 253_402_300_799, "time out of range")
            // What parses re-formats to a date that parses to the same instant.
            if t >= 0 { precondition(HTTPTime.parseIMFFixdate(imf(t)) == t, "IMF-fixdate round trip") }
        }
    }
    let v = SignedResponseVerdict.classify(status: status, headers: headers, body: body)
    check(v, status: status)
    precondition(SignedResponseVerdict.classify(status: status, headers: headers, body: body + [0x0A, 0x20]) == v
                 || body.count + 2 > SignedResponseVerdict.maxBodyBytes, "trailing white space changed the verdict")
    // A valid time round-trips through the formatter.
    let t = Int64(truncatingIfNeeded: bytes.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }) & 0xFF_FFFF_FFFF
    if t <= 253_402_300_799 { precondition(HTTPTime.parseIMFFixdate(imf(t)) == t, "IMF-fixdate of \(t)") }
    return 0
}
