import BearerdHTTP
import BearerdHTTP2
import Testing
@testable import BearerdProxy

/// The credential goes into an HTTP/2 upstream request's fields the way `HTTPHeaders.set` puts it
/// into a head (the stream sets it on the mapped fields instead of copying the head first).
@Suite("HTTP/2 upstream request fields")
struct BackendH2FieldsTests {
    private func fields(_ pairs: [(String, String)]) -> [HTTPField] { pairs.map { HTTPField(name: $0.0, value: $0.1) } }

    /// Setting the credential on the mapped fields gives what mapping the head it was set on gave.
    @Test(arguments: [
        [("Host", "h"), ("Accept", "*/*")],
        [("Host", "h"), ("Authorization", "Bearer client"), ("Accept", "*/*"), ("authorization", "Basic x")],
        [("authorization", "Bearer client")],
        [("Host", "h"), ("X-A", "1"), ("AUTHORIZATION", "a"), ("X-B", "2"), ("Authorization", "b"), ("X-C", "3")],
    ])
    func settingTheCredentialOnFieldsEqualsSettingItOnTheHead(_ pairs: [(String, String)]) {
        let credential = HTTPField(name: "Authorization", value: "Bearer upstream-token")
        var headers = HTTPHeaders(pairs)
        var head = HTTPRequestHead(method: "GET", target: "/x", headers: headers)
        headers.set(credential.name, credential.value)
        head.headers = headers
        let expected = HTTP2HeaderMapping.requestFields(head, scheme: "http", authority: "h")

        var mapped = HTTP2HeaderMapping.requestFields(HTTPRequestHead(method: "GET", target: "/x", headers: HTTPHeaders(pairs)),
                                                      scheme: "http", authority: "h", lowercasingNames: false)
        BackendH2Stream.set(credential, in: &mapped)
        // The session lower-cases names as it encodes them; compare the names that way.
        let lowered = mapped.map { HTTPField(name: $0.name.lowercased(), value: $0.value) }
        #expect(lowered == expected)
        #expect(mapped.filter { $0.name.lowercased() == "authorization" }.map(\.value) == ["Bearer upstream-token"])
    }
}
