// AES-256-GCM records of the shared token cache (docs/architecture.md §6.13).

import Testing
@testable import BearerdTLS

@Suite struct RecordSealerTests {
    let key = [UInt8](0..<32)

    @Test func sealAndOpenRoundTrip() throws {
        let sealer = try RecordSealer(key: key)
        let aad = Array("bearerd:abc".utf8)
        for size in [0, 1, 15, 16, 17, 1000] {
            let plain = [UInt8]((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7) })
            let sealed = try #require(sealer.seal(plain, aad: aad))
            #expect(sealed.count == size + 12 + 16)
            #expect(sealer.open(sealed, aad: aad) == plain)
        }
        // Random nonce: the same plaintext seals differently.
        #expect(sealer.seal([1, 2, 3], aad: aad) != sealer.seal([1, 2, 3], aad: aad))
    }

    @Test func knownAnswer() throws {
        // The layout nonce ‖ ciphertext ‖ tag, checked against a published answer (also what
        // Python's cryptography AESGCM gives for these inputs).
        let sealer = try RecordSealer(key: [UInt8](repeating: 0, count: 32))
        let sealed = try #require(sealer.seal([UInt8](repeating: 0, count: 16), aad: [], nonce: [UInt8](repeating: 0, count: 12)))
        // AES-256-GCM, zero key, zero IV, 16 zero bytes (McGrew & Viega test case 14).
        #expect(hex(Array(sealed[12..<28])) == "cea7403d4d606b6e074ec5d3baf39d18")
        #expect(hex(Array(sealed[28...])) == "d0d1c8a799996bf0265b98b5d48ab919")
    }

    @Test func tamperWrongKeyAndWrongKeyNameDoNotOpen() throws {
        let sealer = try RecordSealer(key: key)
        let aad = Array("bearerd:abc".utf8)
        let sealed = try #require(sealer.seal(Array("access token".utf8), aad: aad))
        for i in [0, 12, sealed.count - 1] {
            var t = sealed
            t[i] ^= 0x01
            #expect(sealer.open(t, aad: aad) == nil, "byte \(i) flipped")
        }
        let other = try RecordSealer(key: [UInt8](repeating: 9, count: 32))
        #expect(other.open(sealed, aad: aad) == nil)
        #expect(sealer.open(sealed, aad: Array("bearerd:abd".utf8)) == nil)
        #expect(sealer.open(Array(sealed.prefix(27)), aad: aad) == nil)
        #expect(sealer.open([], aad: aad) == nil)
    }

    @Test func keysAre32Bytes() throws {
        // Key files are parsed by BearerdConfig's SharedCacheKey (ConfigSharedCacheTests).
        #expect(throws: RecordSealer.KeyError.self) { try RecordSealer(key: [1, 2, 3]) }
    }

    private func hex(_ b: [UInt8]) -> String {
        b.map { let s = String($0, radix: 16); return s.count == 1 ? "0" + s : s }.joined()
    }
}
