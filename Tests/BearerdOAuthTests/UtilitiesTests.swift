import Testing
@testable import BearerdOAuth

@Suite struct SHA256Tests {
    // FIPS 180-4 / NIST CSRC example values.
    @Test(arguments: [
        ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
        ("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
    ])
    func vectors(input: String, expected: String) {
        #expect(BearerdOAuth.hex(SHA256.hash(input.utf8)) == expected)
    }

    @Test func millionA() {
        #expect(BearerdOAuth.hex(SHA256.hash([UInt8](repeating: 0x61, count: 1_000_000)))
            == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    @Test func incrementalEqualsOneShot() {
        let data = Array((0..<300).map { UInt8(truncatingIfNeeded: $0 * 7) })
        for split in [0, 1, 55, 56, 63, 64, 65, 128, 299] {
            var h = SHA256()
            h.update(data[..<split]); h.update(data[split...])
            #expect(h.finalize() == SHA256.hash(data), "split \(split)")
        }
    }

    @Test func fingerprintIsFirstEightHex() {
        #expect(BearerdOAuth.fingerprint("abc") == "ba7816bf")
        #expect(OAuthSecret("abc").fingerprint == "ba7816bf")
        #expect(BearerdOAuth.fingerprint(bytes: Array("abc".utf8)) == "ba7816bf")
    }
}

@Suite struct SecretTests {
    @Test func redactedEverywhere() {
        let s = OAuthSecret("hunter2")
        #expect(s.description == "<redacted>")
        #expect(s.debugDescription == "<redacted>")
        #expect(!"\(s)".contains("hunter2"))
        #expect(!String(reflecting: s).contains("hunter2"))
        #expect(s == OAuthSecret("hunter2"))
        #expect(s != OAuthSecret("hunter3"))
        #expect(s != OAuthSecret("hunter22"))
    }
}

@Suite struct Base64Tests {
    @Test(arguments: [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="),
                      ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")])
    func rfc4648Vectors(plain: String, encoded: String) {
        #expect(Base64.encode(Array(plain.utf8)) == encoded)
        #expect(Base64.decodeURL(encoded) == Array(plain.utf8))
        #expect(Base64.decodeURL(String(encoded.filter { $0 != "=" })) == Array(plain.utf8))
    }

    @Test func urlAlphabet() {
        #expect(Base64.encode([0xfb, 0xff, 0xbf]) == "+/+/")
        #expect(Base64.decodeURL("-_-_") == [0xfb, 0xff, 0xbf])
        #expect(Base64.decodeURL("+/+/") == nil)
    }

    @Test(arguments: ["Z", "Zg=", "Zm9v=", "Zh==", "Z=g=", "Zm 9v", "Zm9v===="])
    func rejectsMalformed(_ text: String) {
        #expect(Base64.decodeURL(text) == nil)
    }
}

@Suite struct FormURLEncodingTests {
    @Test func appendixB() {
        // RFC 6749 Appendix B: space → '+', non-ASCII as UTF-8 percent-encoded.
        #expect(FormURLEncoding.encode(" %&+£€") == "+%25%26%2B%C2%A3%E2%82%AC")
        #expect(FormURLEncoding.encode("aZ09*-._") == "aZ09*-._")
        #expect(FormURLEncoding.encode("a:b/c~") == "a%3Ab%2Fc%7E")
        #expect(FormURLEncoding.encode([("a b", "c=d"), ("e", "")]) == "a+b=c%3Dd&e=")
    }
}

@Suite struct JSONParserTests {
    let parser = JSONParser()

    @Test func parsesAllKinds() throws {
        let v = try parser.parse(#" {"a":[1,-2.5e3,true,false,null,"x"],"b":{"c":"\"\\\/\b\f\n\r\t"}} "#)
        #expect(v["a"] == .array([.number("1"), .number("-2.5e3"), .bool(true), .bool(false), .null, .string("x")]))
        #expect(v["b"]?["c"] == .string("\"\\/\u{8}\u{c}\n\r\t"))
    }

    @Test func unicodeEscapes() throws {
        #expect(try parser.parse(#""\u00e9\u20AC""#) == .string("é€"))
        #expect(try parser.parse(#""\ud83d\ude00""#) == .string("😀"))
        #expect(try parser.parse("\"ü😀\"") == .string("ü😀"))
    }

    @Test func numbersKeepTheirText() throws {
        #expect(try parser.parse("9007199254740993").int64Value == 9007199254740993)
        #expect(try parser.parse("3600.0").int64Value == nil)
        #expect(try parser.parse("3600.0").doubleValue == 3600)
        #expect(try parser.parse("-0").int64Value == 0)
    }

    @Test(arguments: [
        ("", "json.unexpected_end"), ("{", "json.unexpected_end"), ("[1,]", "json.unexpected_character"),
        ("{\"a\":1,}", "json.expected_name"), ("01", "json.leading_zero"), ("1.", "json.invalid_number"),
        ("-", "json.invalid_number"), ("1e", "json.invalid_number"), (".5", "json.unexpected_character"),
        ("+1", "json.unexpected_character"), ("tru", "json.invalid_literal"), ("nul", "json.invalid_literal"),
        ("\"a", "json.unterminated_string"), ("\"\\x\"", "json.invalid_escape"), ("\"\\u12\"", "json.invalid_escape"),
        ("\"\\ud83d\"", "json.lone_surrogate"), ("\"\\ude00\"", "json.lone_surrogate"),
        ("\"\\ud83d\\u0041\"", "json.lone_surrogate"), ("\"a\u{1}b\"", "json.control_character"),
        ("{\"a\":1,\"a\":2}", "json.duplicate_name"), ("1 2", "json.trailing_data"), ("{} x", "json.trailing_data"),
        ("// c\n1", "json.unexpected_character"), ("{a:1}", "json.expected_name"), ("{\"a\" 1}", "json.expected_colon"),
        ("[1 2]", "json.expected_comma_or_end"), ("'a'", "json.unexpected_character"),
    ])
    func rejects(text: String, reason: String) {
        #expect(throws: JSONError.self) { try parser.parse(text) }
        do { _ = try parser.parse(text) } catch { #expect(error.reason == reason, "\(text)") }
    }

    @Test func rejectsInvalidUTF8() {
        #expect(throws: JSONError(reason: "json.invalid_utf8", offset: 0)) { try parser.parse([0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: JSONError.self) { try parser.parse([0x22, 0xED, 0xA0, 0x80, 0x22]) }  // UTF-8 encoded surrogate
    }

    @Test func depthAndSizeLimits() throws {
        let small = JSONParser(maxDepth: 3, maxBytes: 16)
        #expect(try small.parse("[[[1]]]") == .array([.array([.array([.number("1")])])]))
        #expect(throws: JSONError.self) { try small.parse("[[[[1]]]]") }
        #expect(throws: JSONError(reason: "json.too_large", offset: 16)) { try small.parse("\"" + String(repeating: "a", count: 20) + "\"") }
        // Deep nesting is refused, not a stack overflow.
        #expect(throws: JSONError.self) { try parser.parse(String(repeating: "[", count: 100_000)) }
    }
}
