import Testing
@testable import BearerdTLS

/// `Digest` against published vectors: FIPS 180-2 (SHA-256 of "abc" and of nothing) and
/// RFC 4231 §4.2, §4.3 (HMAC-SHA-256), plus an empty key, which signing never uses but a
/// caller may pass.
@Suite struct DigestTests {
    static func hex(_ b: [UInt8]) -> String { b.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }

    @Test func sha256Vectors() {
        #expect(Self.hex(Digest.sha256(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(Self.hex(Digest.sha256([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    @Test func hmacVectors() {
        #expect(Self.hex(Digest.hmacSHA256(key: [UInt8](repeating: 0x0b, count: 20), message: Array("Hi There".utf8)))
                == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        #expect(Self.hex(Digest.hmacSHA256(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)))
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        // HMAC-SHA-256 with an empty key and an empty message (as Python's hmac computes it).
        #expect(Self.hex(Digest.hmacSHA256(key: [], message: []))
                == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
    }
}
