import Testing
@testable import BearerdIO
@Test func BearerdIOTestsBuilds() { #expect(Bool(true)) }
