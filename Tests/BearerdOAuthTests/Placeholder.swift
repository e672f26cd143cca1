import Testing
@testable import BearerdOAuth
@Test func BearerdOAuthTestsBuilds() { #expect(Bool(true)) }
