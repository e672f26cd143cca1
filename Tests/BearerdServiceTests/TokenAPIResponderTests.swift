import Testing
@testable import BearerdService

/// The token API's browser guard: which request fields make a request browser-like (DESIGN §4 `token_api:`).
@Suite struct TokenAPIResponderTests {
    @Test func browserFieldsAreRecognised() {
        for n in ["Origin", "origin", "Sec-Fetch-Site", "sec-fetch-mode", "SEC-FETCH-DEST", "Sec-Fetch-User"] {
            #expect(TokenAPIResponder.isBrowserField(n))
        }
        for n in ["Bearerd-Token-Request", "Referer", "Host", "Sec-WebSocket-Key"] {
            #expect(!TokenAPIResponder.isBrowserField(n))
        }
    }
}
