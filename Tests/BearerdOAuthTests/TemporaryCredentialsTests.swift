import Testing
@testable import BearerdOAuth

/// The signing-credentials codec against real documents: AWS STS XML exactly as moto 5.2.1's
/// server answers (captured over HTTP), the JSON field names botocore 1.43 reads
/// (`ContainerProvider`, `ProcessProvider`), Alibaba's STS `AssumeRoleWithOIDC` documentation
/// example and error shape, and the vending shapes (the seed's and Alibaba's credentials URI).
@Suite struct TemporaryCredentialsTests {
    func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

    func reason(_ body: () throws(CredentialsError) -> Any) -> CredentialsError? {
        do { _ = try body(); return nil } catch { return error }
    }

    // moto 5.2.1, POST Action=AssumeRoleWithWebIdentity (ThreadedMotoServer), body verbatim.
    static let motoWebIdentity = """
        <AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIARZPUZDIKALUIHJQW</AccessKeyId><SecretAccessKey>E9YpdEgn4FBi2I7freheKkgCf3QkCydWpsck5Jsj</SecretAccessKey><SessionToken>FQoGZXIvYXdzEBYaDX3/2JGW5TmcGnfCijHWbYnEFJ9cAJaunC/pRYsx2oxbq5DlJm1Vgt0ximPIvYXrjqVpLulzO2U9iIfncRHe7bXHckS1+j08T4+5GOsa2G3qpC6CWEhiLj67q89Bz6Zps9k3Fh6hqu61lGbuIBbfIIQGEy65p94e/zDv914927+wTHbM/KX5JR7J5CeiTUxeAA4xdvtlkOdINAlT7BUbtrmi7C6XMfCBDokGLTNfJkZ6dugSkSAL/J7FuF6MEh46Ff55gU2YpdYBZnfrLu23mXMmnsaCcA8vxjoZcmnr12KIloDOPH3q16ph/4E21rrNtSmCFhz/p5LqDQKZknQ=</SessionToken><Expiration>2026-11-29T09:31:31.392232Z</Expiration></Credentials><AssumedRoleUser><AssumedRoleId>ARO123EXAMPLE123:bearerd</AssumedRoleId><Arn>arn:aws:sts::123456789012:assumed-role/demo/bearerd</Arn></AssumedRoleUser><PackedPolicySize>6</PackedPolicySize></AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>fPsEavG73zwcCRbji743KNkTXF17tEkma9UwprTg1TzfA525N6NA</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>
        """
    // moto 5.2.1, POST Action=AssumeRole.
    static let motoAssumeRole = """
        <AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials><AccessKeyId>ASIARZPUZDIKERXWTXHV</AccessKeyId><SecretAccessKey>3mSYS1O2rlc4NAU57UVfF9swka+Ek6Qcu57wevS2</SecretAccessKey><SessionToken>FQoGZXIvYXdzEBYaDwAT9MJJHZsYHHqtEvJzltsZztUS9SgKN3hhUqxUyqQrCgyb0B2iMgnQZ1lRdQac+77liVc+tON/L0+kJx9Ys1hpBERcgaYJguirv34zm23ltNGAXaum0G3tOi+t3N02+6H+iliCElJXUXZqVGc0TRmYaPxF+a8loReWYIcS8862mL4CPDLIA508q/3XnibN2Z4KYS9S1Oz8XEfrOSDYL52XZFzhg4LON9sgmR9ZQAnh3le26xfGSVjy0iQ0BMFAcRpMcKnn5VcZfoYr6lRJv0L8g2qQ9M5eKisjf1C6WWshSZKdsJOleiuxzY31dyf8zzniZ6Nml7z6kC6WRCE=</SessionToken><Expiration>2026-11-29T09:31:31.429638Z</Expiration></Credentials><AssumedRoleUser><AssumedRoleId>AROA3X42LBCDZ1M0Z7JWU:bearerd</AssumedRoleId><Arn>arn:aws:sts::123456789012:assumed-role/demo/bearerd</Arn></AssumedRoleUser><PackedPolicySize>6</PackedPolicySize></AssumeRoleResult><ResponseMetadata><RequestId>KL38RSjoT1coKwNB6LXiIsDqHbIcQCT4PBWuyKTl4Mn53nkvM36W</RequestId></ResponseMetadata></AssumeRoleResponse>
        """
    // moto 5.2.1, AssumeRole with a 70-character RoleSessionName: HTTP 400.
    static let motoValidationError = """
        <ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>ValidationError</Code><Message>1 validation error detected: Value 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' at 'roleSessionName' failed to satisfy constraint: Member must have length less than or  equal to 64</Message></Error><RequestId>LU3Y85EAz4fl19YzNZBUEsuIAFwzmcJuF0I9cE48w8vNECBDlNfv</RequestId></ErrorResponse>
        """

    // MARK: AWS STS XML

    @Test func stsWebIdentityFromMoto() throws {
        let c = try TemporaryCredentials.fromSTSXML(bytes(Self.motoWebIdentity), action: .assumeRoleWithWebIdentity)
        #expect(c.accessKeyID == "ASIARZPUZDIKALUIHJQW")
        #expect(c.secret.exposedValue == "E9YpdEgn4FBi2I7freheKkgCf3QkCydWpsck5Jsj")
        #expect(c.sessionToken?.exposedValue.hasPrefix("FQoGZXIvYXdzEBYaDX3/2JGW") == true)
        #expect(c.sessionToken?.exposedValue.hasSuffix("QKZknQ=") == true)
        #expect(c.expiresAt == 1_795_944_691)  // Python: datetime.fromisoformat(...).timestamp() floored
        #expect(!c.description.contains("E9YpdEgn") && !c.description.contains("FQoG") && !c.description.contains("ASIARZ"))
        #expect(c.description.contains(BearerdOAuth.fingerprint("ASIARZPUZDIKALUIHJQW")))
    }

    @Test func stsAssumeRoleFromMoto() throws {
        let c = try TemporaryCredentials.fromSTSXML(bytes(Self.motoAssumeRole), action: .assumeRole)
        #expect(c.accessKeyID == "ASIARZPUZDIKERXWTXHV")
        #expect(c.secret.exposedValue == "3mSYS1O2rlc4NAU57UVfF9swka+Ek6Qcu57wevS2")
        #expect(c.expiresAt == 1_795_944_691)
        // The answer to one action is not accepted for the other.
        let e = reason { () throws(CredentialsError) in try TemporaryCredentials.fromSTSXML(bytes(Self.motoAssumeRole), action: .assumeRoleWithWebIdentity) }
        #expect(e?.reason == "credentials.unexpected_document")
    }

    @Test func stsPrettyPrintedWithPrologCommentsAndReferences() throws {
        let doc = """
            \u{FEFF}<?xml version="1.0" encoding="UTF-8"?>
            <!-- AWS documentation layout -->
            <sts:AssumeRoleWithWebIdentityResponse xmlns:sts="https://sts.amazonaws.com/doc/2011-06-15/">
              <sts:AssumeRoleWithWebIdentityResult>
                <SubjectFromWebIdentityToken>amzn1.account.AF6RHO7KZU5XRVQJGXK6HB56KR2A</SubjectFromWebIdentityToken>
                <Credentials>
                  <SessionToken>
                    AQoDYXdzEE0a8ANXXXXXXXXNO1ewxE5TijQyp+IEXAMPLE&#x2B;a&#61;
                  </SessionToken>
                  <SecretAccessKey><![CDATA[wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY]]></SecretAccessKey>
                  <Expiration>2014-10-24T23:00:23Z</Expiration>
                  <AccessKeyId>ASgeIAIOSFODNN7EXAMPLE</AccessKeyId>
                </Credentials>
              </sts:AssumeRoleWithWebIdentityResult>
              <ResponseMetadata><RequestId>ad4156e9-bce1-11e2-82e6-6b6efEXAMPLE</RequestId></ResponseMetadata>
            </sts:AssumeRoleWithWebIdentityResponse>
            """
        let c = try TemporaryCredentials.fromSTSXML(bytes(doc), action: .assumeRoleWithWebIdentity)
        #expect(c.sessionToken?.exposedValue == "AQoDYXdzEE0a8ANXXXXXXXXNO1ewxE5TijQyp+IEXAMPLE+a=")
        #expect(c.secret.exposedValue == "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY")
        #expect(c.accessKeyID == "ASgeIAIOSFODNN7EXAMPLE")
        #expect(c.expiresAt == 1_414_191_623)
    }

    @Test func stsErrorsBecomeTypedReasons() {
        let e = reason { () throws(CredentialsError) in try TemporaryCredentials.fromSTSXML(bytes(Self.motoValidationError), action: .assumeRole) }
        #expect(e?.reason == "sts.ValidationError")
        #expect(e?.code == "ValidationError")
        #expect(e?.message?.hasPrefix("1 validation error detected: Value '<redacted>' at 'roleSessionName'") == true)

        // The shape AWS answers an expired or foreign web identity token with; the token echoed in
        // the message is cut (the secret that was sent, and any long token-like run).
        let token = OAuthSecret("eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW0ifQ.c2ln")
        let doc = """
            <ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
              <Error>
                <Type>Sender</Type>
                <Code>InvalidIdentityToken</Code>
                <Message>Token eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW0ifQ.c2ln is expired&#13;&#10;injected: line</Message>
              </Error>
              <RequestId>c6104cbe-af31-11e0-8154-cbc7ccf896c7</RequestId>
            </ErrorResponse>
            """
        let e2 = reason { () throws(CredentialsError) in
            try TemporaryCredentials.fromSTSXML(bytes(doc), action: .assumeRoleWithWebIdentity, redacting: [token])
        }
        #expect(e2?.reason == "sts.InvalidIdentityToken")
        #expect(e2?.message == "Token <redacted> is expired??injected: line")
        #expect(e2.map { !$0.description.contains("eyJhbGci") } == true)

        // An odd code is made reason-safe; a very long message is bounded.
        let odd = "<ErrorResponse><Error><Code>Bad Code\u{7F}/x</Code><Message>\(String(repeating: "word ", count: 200))</Message></Error></ErrorResponse>"
        let e3 = reason { () throws(CredentialsError) in try TemporaryCredentials.fromSTSXML(bytes(odd), action: .assumeRole) }
        #expect(e3?.reason == "sts.Bad_Code__x")
        #expect(e3?.message?.count == 256)

        let noCode = "<ErrorResponse><Error><Message>m</Message></Error></ErrorResponse>"
        #expect(reason { () throws(CredentialsError) in try TemporaryCredentials.fromSTSXML(bytes(noCode), action: .assumeRole) }?.reason == "sts.error_without_code")
    }

    @Test func stsStructuralErrors() {
        func r(_ doc: String) -> String? {
            reason { () throws(CredentialsError) in try TemporaryCredentials.fromSTSXML(Array(doc.utf8), action: .assumeRole) }?.reason
        }
        let ok = "<AccessKeyId>AK</AccessKeyId><SecretAccessKey>S</SecretAccessKey><SessionToken>T</SessionToken><Expiration>2026-11-29T08:00:00Z</Expiration>"
        func wrap(_ inner: String) -> String { "<AssumeRoleResponse><AssumeRoleResult><Credentials>\(inner)</Credentials></AssumeRoleResult></AssumeRoleResponse>" }
        #expect(r(wrap(ok)) == nil)
        #expect(r(wrap(ok.replacingFirst("<SessionToken>T</SessionToken>", with: ""))) == "credentials.missing_field")
        #expect(r(wrap(ok + "<AccessKeyId>AK2</AccessKeyId>")) == "credentials.duplicate_field")
        #expect(r(wrap(ok.replacingFirst("<SessionToken>T</SessionToken>", with: "<SessionToken>T&#13;&#10;X-Evil: 1</SessionToken>"))) == "credentials.control_character")
        #expect(r(wrap(ok.replacingFirst("<AccessKeyId>AK</AccessKeyId>", with: "<AccessKeyId></AccessKeyId>"))) == "credentials.empty_field")
        #expect(r(wrap(ok.replacingFirst("<SecretAccessKey>S</SecretAccessKey>", with: "<SecretAccessKey><b>S</b></SecretAccessKey>"))) == "credentials.invalid_field")
        #expect(r(wrap(ok.replacingFirst("2026-11-29T08:00:00Z", with: "tomorrow"))) == "credentials.invalid_expiration")
        #expect(r("<AssumeRoleResponse><AssumeRoleResult/></AssumeRoleResponse>") == "credentials.missing_field")
        #expect(r("<AssumeRoleResponse/>") == "credentials.missing_field")
        #expect(r("not xml") == "credentials.malformed_xml")
        #expect(r("<!DOCTYPE lolz [<!ENTITY lol \"lol\">]><AssumeRoleResponse>&lol;</AssumeRoleResponse>") == "credentials.malformed_xml")
        #expect(r(wrap(ok) + String(repeating: " ", count: 64 * 1024)) == "credentials.too_large")
    }

    // MARK: The XML reader

    func xmlReason(_ doc: String, maxDepth: Int = 16) -> String? {
        do { _ = try SimpleXML.Reader(maxDepth: maxDepth).parse(Array(doc.utf8)); return nil } catch { return error.reason }
    }

    @Test func xmlReaderTree() throws {
        let root = try SimpleXML.Reader().parse(Array("<a:Root xmlns:a='u' k=\"&quot;v&quot;\"><b>x&lt;y&amp;&gt;&apos;&#65;&#x42;</b><c/><b>2</b>tail</a:Root>".utf8))
        #expect(root.name == "Root")
        #expect(root.children.map(\.name) == ["b", "c", "b"])
        #expect(root.child("b")?.text == "x<y&>'AB")
        #expect(root.text == "tail")
    }

    @Test func xmlReaderRefusals() {
        #expect(xmlReason("<!DOCTYPE a><a/>") == "xml.doctype_not_allowed")
        #expect(xmlReason("<a><!DOCTYPE a></a>") == "xml.doctype_not_allowed")
        #expect(xmlReason("<a>&ent;</a>") == "xml.unknown_entity")
        #expect(xmlReason("<a>&amp</a>") == "xml.invalid_reference")
        #expect(xmlReason("<a>&#0;</a>") == "xml.invalid_character_reference")
        #expect(xmlReason("<a>&#xD800;</a>") == "xml.invalid_character_reference")
        #expect(xmlReason("<a>&#x110000;</a>") == "xml.invalid_character_reference")
        #expect(xmlReason("<a>&#123456789;</a>") == "xml.invalid_reference")
        #expect(xmlReason("<a>\u{01}</a>") == "xml.invalid_character")
        #expect(xmlReason("<a></b>") == "xml.mismatched_end_tag")
        #expect(xmlReason("<a><b></a></b>") == "xml.mismatched_end_tag")
        #expect(xmlReason("<a>") == "xml.unexpected_end")
        #expect(xmlReason("<a/><b/>") == "xml.trailing_data")
        #expect(xmlReason("<a/>x") == "xml.trailing_data")
        #expect(xmlReason("x<a/>") == "xml.expected_root")
        #expect(xmlReason("") == "xml.expected_root")
        #expect(xmlReason("<a x='1'y='2'/>") == "xml.expected_space")
        #expect(xmlReason("<a x='<'/>") == "xml.lt_in_attribute")
        #expect(xmlReason("<a x=1/>") == "xml.expected_quote")
        #expect(xmlReason("<1a/>") == "xml.invalid_name")
        #expect(xmlReason("<a:/>") == "xml.invalid_name")
        #expect(xmlReason("<a><!-- x </a>") == "xml.unterminated_comment")
        #expect(xmlReason("<a><![CDATA[x</a>") == "xml.unterminated_cdata")
        #expect(xmlReason("<a>\u{FF}</a>") == nil)  // a valid non-ASCII scalar is character data
        var invalid = Array("<a>x</a>".utf8); invalid[4] = 0xFF
        #expect((try? SimpleXML.Reader().parse(invalid)) == nil)
        #expect((try? SimpleXML.Reader(maxBytes: 8).parse(Array("<a>xx</a>".utf8))) == nil)
    }

    @Test func xmlDeepNestingIsBounded() {
        let deep = String(repeating: "<a>", count: 16) + String(repeating: "</a>", count: 16)
        #expect(xmlReason(deep) == nil)
        let tooDeep = String(repeating: "<a>", count: 17) + String(repeating: "</a>", count: 17)
        #expect(xmlReason(tooDeep) == "xml.too_deep")
        // Far deeper than any stack could take recursively: refused at the bound, no crash.
        let hostile = String(repeating: "<a>", count: 20_000)
        #expect(xmlReason(hostile) == "xml.too_deep")
    }

    // MARK: JSON shapes

    @Test func containerCredentials() throws {
        // The members botocore's ContainerProvider reads (AccessKeyId, SecretAccessKey, Token,
        // Expiration), plus the extras ECS/EKS Pod Identity send.
        let doc = """
            {"RoleArn":"arn:aws:iam::123456789012:role/task","AccessKeyId":"ASIAIOSFODNN7EXAMPLE","SecretAccessKey":"wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY","Token":"IQoJb3JpZ2luX2VjEXAMPLE==","Expiration":"2026-11-29T08:00:00Z","AccountId":"123456789012"}
            """
        let c = try TemporaryCredentials.fromContainerCredentialsJSON(bytes(doc))
        #expect(c == TemporaryCredentials(accessKeyID: "ASIAIOSFODNN7EXAMPLE", secret: OAuthSecret("wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"),
                                          sessionToken: OAuthSecret("IQoJb3JpZ2luX2VjEXAMPLE=="), expiresAt: 1_795_939_200))
        func r(_ d: String) -> CredentialsError? { reason { () throws(CredentialsError) in try TemporaryCredentials.fromContainerCredentialsJSON(Array(d.utf8)) } }
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"2026-11-29T08:00:00Z"}"#)?.field == "Token")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"S","Token":"T"}"#)?.reason == "credentials.missing_field")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":7,"Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.invalid_field")
        #expect(r(#"{"AccessKeyId":"","SecretAccessKey":"S","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.empty_field")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.field == "SecretAccessKey")
        #expect(r(#"{"AccessKeyId":"A\r\nX: y","SecretAccessKey":"S","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.control_character")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"S\u0000","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.control_character")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"S","Token":"T\u007f","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.control_character")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"S","Token":"T T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.invalid_field")
        #expect(r(#"{"AccessKeyId":"Ä","SecretAccessKey":"S","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.invalid_field")
        #expect(r(#"{"AccessKeyId":"\#(String(repeating: "A", count: 129))","SecretAccessKey":"S","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#)?.reason == "credentials.field_too_long")
        #expect(r(#"["AccessKeyId"]"#)?.reason == "credentials.not_an_object")
        #expect(r(#"{"AccessKeyId":"A",}"#)?.reason == "credentials.malformed_json")
        #expect(r(String(repeating: "[", count: 10_000))?.reason == "credentials.malformed_json")
        #expect(r(#"{"x":""# + String(repeating: "a", count: 64 * 1024) + #""}"#)?.reason == "credentials.too_large")
    }

    @Test func aliyunVendingShapes() throws {
        // The seed's token vending server.
        let seed = #"{"accessKeyId":"STS.NUgYrLnoC37mZZCNnAbez","accessKeySecret":"CVwjCkNzTMupZ8NbTCxCBRq3K16jtcWFTJAyBEv2","securityToken":"CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7Bih","expiration":"2026-11-29T08:00:00Z"}"#
        let c = try TemporaryCredentials.fromAliyunVendingJSON(bytes(seed))
        #expect(c.accessKeyID == "STS.NUgYrLnoC37mZZCNnAbez" && c.secret.exposedValue == "CVwjCkNzTMupZ8NbTCxCBRq3K16jtcWFTJAyBEv2")
        #expect(c.sessionToken?.exposedValue == "CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7Bih" && c.expiresAt == 1_795_939_200)
        // Alibaba's credentials URI provider (credentials-go `URLCredentialsProvider`) reads these names.
        let upper = #"{"Code":"Success","AccessKeyId":"STS.A","AccessKeySecret":"S","SecurityToken":"T","Expiration":"2026-11-29T16:00:00+08:00"}"#
        #expect(try TemporaryCredentials.fromAliyunVendingJSON(bytes(upper)).expiresAt == 1_795_939_200)
        func r(_ d: String) -> String? { reason { () throws(CredentialsError) in try TemporaryCredentials.fromAliyunVendingJSON(Array(d.utf8)) }?.reason }
        #expect(r(#"{"accessKeyId":"A","accessKeySecret":"S","AccessKeySecret":"S2","securityToken":"T","expiration":"2026-11-29T08:00:00Z"}"#) == "credentials.ambiguous_shape")
        #expect(r(#"{"accessKeyId":"A","accessKeySecret":"S","securityToken":"T"}"#) == "credentials.missing_field")
        #expect(r(#"{"accessKeyId":"A","accessKeySecret":"S","securityToken":null,"expiration":"2026-11-29T08:00:00Z"}"#) == "credentials.missing_field")
    }

    @Test func credentialProcess() throws {
        // botocore ProcessProvider: Version must equal 1; SessionToken and Expiration optional.
        let full = #"{"Version": 1, "AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "SessionToken": "token", "Expiration": "2026-11-29T08:00:00.999Z", "AccountId": "123456789012"}"#
        let c = try TemporaryCredentials.fromCredentialProcessJSON(bytes(full))
        #expect(c.sessionToken?.exposedValue == "token" && c.expiresAt == 1_795_939_200)
        let longTerm = try TemporaryCredentials.fromCredentialProcessJSON(bytes(#"{"Version":1,"AccessKeyId":"AKIAEXAMPLE","SecretAccessKey":"s"}"#))
        #expect(longTerm.expiresAt == nil && longTerm.sessionToken == nil)
        let nulls = try TemporaryCredentials.fromCredentialProcessJSON(bytes(#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"s","SessionToken":null,"Expiration":null}"#))
        #expect(nulls.expiresAt == nil && nulls.sessionToken == nil)
        func r(_ d: String) -> CredentialsError? { reason { () throws(CredentialsError) in try TemporaryCredentials.fromCredentialProcessJSON(Array(d.utf8)) } }
        for version in ["2", "\"1\"", "1.5", "true", "null", "0"] {
            #expect(r(#"{"Version":\#(version),"AccessKeyId":"A","SecretAccessKey":"s"}"#)?.reason == "credentials.wrong_version")
        }
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"s"}"#)?.reason == "credentials.wrong_version")
        #expect(r(#"{"Version":1,"SecretAccessKey":"s"}"#)?.field == "AccessKeyId")
        #expect(r(#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"s","Expiration":"2026-11-29 08:00:00"}"#)?.reason == "credentials.invalid_expiration")
        #expect(r(#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"s","SessionToken":"a\nb"}"#)?.reason == "credentials.control_character")
    }

    @Test func aliyunSTS() throws {
        // Alibaba Cloud documentation, AssumeRoleWithOIDC response example (Format=JSON).
        let doc = """
            {"RequestId":"3D57EAD2-8723-1F26-B69C-F8707D8B565D","OIDCTokenInfo":{"Subject":"KryrkIdjylZb7agUgCEf****","Issuer":"https://dev-xxxxxx.okta.com","ClientIds":"496271242565057****"},"AssumedRoleUser":{"AssumedRoleId":"33157794895460****","Arn":"acs:ram::113511544585****:role/testoidc/TestOidcAssumedRoleSession"},"Credentials":{"SecurityToken":"CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7BihPWGWHz****","Expiration":"2021-10-19T10:01:03Z","AccessKeySecret":"CVwjCkNzTMupZ8NbTCxCBRq3K16jtcWFTJAyBEv2****","AccessKeyId":"STS.NUgYrLnoC37mZZCNnAbez****"}}
            """
        let c = try TemporaryCredentials.fromAliyunSTSJSON(bytes(doc))
        #expect(c.accessKeyID == "STS.NUgYrLnoC37mZZCNnAbez****" && c.expiresAt == 1_634_637_663)
        #expect(c.sessionToken?.exposedValue == "CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7BihPWGWHz****")
        // Alibaba's error shape.
        let err = #"{"RequestId":"5A1E2E4D-7E7C-5B6B-9E1B-2D2E0B0B0B0B","HostId":"sts.aliyuncs.com","Code":"AuthenticationFail.OIDCToken.Expired","Message":"The OIDC token eyJraWQiOiJKQzl3eHpyaHFKMGd0eXYifQ.eyJzdWIiOiJ4In0.sig has expired.","Recommend":"https://api.aliyun.com/troubleshoot?q=AuthenticationFail.OIDCToken.Expired"}"#
        let e = reason { () throws(CredentialsError) in
            try TemporaryCredentials.fromAliyunSTSJSON(Array(err.utf8), redacting: [OAuthSecret("eyJraWQiOiJKQzl3eHpyaHFKMGd0eXYifQ.eyJzdWIiOiJ4In0.sig")])
        }
        #expect(e?.reason == "sts.AuthenticationFail.OIDCToken.Expired")
        #expect(e?.message == "The OIDC token <redacted> has expired.")
        func r(_ d: String) -> String? { reason { () throws(CredentialsError) in try TemporaryCredentials.fromAliyunSTSJSON(Array(d.utf8)) }?.reason }
        #expect(r(#"{"RequestId":"x"}"#) == "credentials.missing_field")
        #expect(r(#"{"Credentials":"x"}"#) == "credentials.invalid_field")
        #expect(r(#"{"Credentials":{"AccessKeyId":"A","AccessKeySecret":"S","Expiration":"2021-10-19T10:01:03Z"}}"#) == "credentials.missing_field")
    }

    @Test func vendingURLDetectsTheShape() throws {
        let container = #"{"AccessKeyId":"A1","SecretAccessKey":"S","Token":"T","Expiration":"2026-11-29T08:00:00Z"}"#
        let seed = #"{"accessKeyId":"A2","accessKeySecret":"S","securityToken":"T","expiration":"2026-11-29T08:00:00Z"}"#
        let upper = #"{"AccessKeyId":"A3","AccessKeySecret":"S","SecurityToken":"T","Expiration":"2026-11-29T08:00:00Z"}"#
        let sts = #"{"RequestId":"r","Credentials":{"AccessKeyId":"A4","AccessKeySecret":"S","SecurityToken":"T","Expiration":"2026-11-29T08:00:00Z"}}"#
        for (doc, id) in [(container, "A1"), (seed, "A2"), (upper, "A3"), (sts, "A4")] {
            #expect(try TemporaryCredentials.fromVendingURLJSON(bytes(doc)).accessKeyID == id)
        }
        #expect(TemporaryCredentials.vendingShape(of: try JSONParser().parse(container).objectValue ?? [:]) == .containerCredentials)
        #expect(TemporaryCredentials.vendingShape(of: try JSONParser().parse(sts).objectValue ?? [:]) == .aliyunSTS)
        func r(_ d: String) -> CredentialsError? { reason { () throws(CredentialsError) in try TemporaryCredentials.fromVendingURLJSON(Array(d.utf8)) } }
        let vendor = r(#"{"code":"AccessDenied","message":"role not assumable\r\n"}"#)
        #expect(vendor?.reason == "credentials.vendor_error" && vendor?.code == "AccessDenied" && vendor?.message == "role not assumable??")
        #expect(r(#"{"AccessKeyId":"A","Secret":"S"}"#)?.reason == "credentials.unknown_shape")
        #expect(r(#"{"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"2026-11-29T08:00:00Z"}"#)?.field == "Token")
    }

    // MARK: Timestamps

    @Test func timestampsParse() throws {
        // Expected values from Python's datetime.fromisoformat(...).timestamp(), floored.
        let cases: [(String, Int64)] = [
            ("2026-11-29T08:00:00Z", 1_795_939_200),
            ("2026-11-29t08:00:00z", 1_795_939_200),
            ("2026-11-29T16:00:00+08:00", 1_795_939_200),
            ("2026-11-29T02:30:00-05:30", 1_795_939_200),
            ("2026-11-29T08:00:00+0130", 1_795_933_800),
            ("2026-11-29T08:00:00.999999999Z", 1_795_939_200),
            ("2026-11-29T08:00:00,5+00:00", 1_795_939_200),
            ("2030-01-29T18:18:10.443674Z", 1_895_941_090),
            ("2024-02-29T23:59:59Z", 1_709_251_199),
            ("2000-02-29T00:00:00Z", 951_782_400),
            ("2016-12-31T23:59:60Z", 1_483_228_799),  // a leap second counts as :59
            ("1970-01-01T00:00:00Z", 0),
            ("1969-12-31T23:59:59Z", -1),
            ("0000-01-01T00:00:00Z", -62_167_219_200),
            ("9999-12-31T23:59:59Z", 253_402_300_799),
            ("9999-12-31T23:59:59-23:59", 253_402_387_139),
        ]
        for (text, expected) in cases {
            #expect(try ISO8601Timestamp.parse(text) == expected, "\(text)")
        }
    }

    @Test func timestampsRefused() {
        let bad: [(String, String)] = [
            ("2023-02-29T00:00:00Z", "day out of range"),
            ("1900-02-29T00:00:00Z", "day out of range"),
            ("2026-04-31T00:00:00Z", "day out of range"),
            ("2026-11-00T00:00:00Z", "day out of range"),
            ("2026-13-01T00:00:00Z", "month out of range"),
            ("2026-00-01T00:00:00Z", "month out of range"),
            ("2026-11-29T24:00:00Z", "hour out of range"),
            ("2026-11-29T08:60:00Z", "minute out of range"),
            ("2026-11-29T08:00:61Z", "second out of range"),
            ("2026-11-29T08:00:00+24:00", "offset out of range"),
            ("2026-11-29T08:00:00+08:60", "offset out of range"),
            ("2026-11-29T08:00:00", "no time zone (Z or ±hh:mm)"),
            ("2026-11-29T08:00:00.Z", "empty fraction"),
            ("2026-11-29T08:00:00ZZ", "trailing characters"),
            ("2026-11-29T08:00:00+8", "malformed offset"),
            ("2026-11-29T08:00:00 GMT", "no time zone (Z or ±hh:mm)"),
            ("2026-11-29 08:00:00Z", "not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)"),
            ("+2026-11-29T08:00:00Z", "not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)"),
            ("1795939200", "not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)"),
            ("", "not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)"),
            ("2026-11-29T08:00:00." + String(repeating: "9", count: 60) + "Z", "longer than 64 bytes"),
        ]
        for (text, why) in bad {
            do {
                _ = try ISO8601Timestamp.parse(text)
                Issue.record("accepted \(text)")
            } catch {
                #expect(error.reason == "credentials.invalid_expiration" && error.field == "Expiration")
                #expect(error.message == why, "\(text)")
            }
        }
    }

    @Test func timestampsFormat() throws {
        #expect(ISO8601Timestamp.format(1_795_939_200) == "2026-11-29T08:00:00Z")
        #expect(ISO8601Timestamp.format(0) == "1970-01-01T00:00:00Z")
        #expect(ISO8601Timestamp.format(-1) == "1969-12-31T23:59:59Z")
        #expect(ISO8601Timestamp.format(951_782_400) == "2000-02-29T00:00:00Z")
        #expect(ISO8601Timestamp.format(.max) == "9999-12-31T23:59:59Z")
        #expect(ISO8601Timestamp.format(.min) == "0000-01-01T00:00:00Z")
        var t: Int64 = -62_167_219_200
        while t < 253_402_300_799 {
            #expect(try ISO8601Timestamp.parse(ISO8601Timestamp.format(t)) == t)
            t += 86_400 * 3_651 + 12_345
        }
    }

    // MARK: Request forms

    @Test func awsWebIdentityForm() throws {
        let token = OAuthSecret("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln+/=")
        let r = try STSRequestForm.assumeRoleWithWebIdentity(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "bearerd",
                                                             webIdentityToken: token, durationSeconds: 3600)
        #expect(String(decoding: r.body, as: UTF8.self) == "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fdemo&RoleSessionName=bearerd&WebIdentityToken=eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln%2B%2F%3D&DurationSeconds=3600")
        #expect(r.header("Content-Type") == "application/x-www-form-urlencoded")
        #expect(!r.description.contains("eyJ"))
        let short = try STSRequestForm.assumeRoleWithWebIdentity(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "s@x.io",
                                                                 webIdentityToken: token)
        #expect(!String(decoding: short.body, as: UTF8.self).contains("DurationSeconds"))
        func r2(_ body: () throws(CredentialsError) -> Any) -> String? { reason(body)?.field }
        #expect(r2 { () throws(CredentialsError) in try STSRequestForm.assumeRoleWithWebIdentity(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "a b", webIdentityToken: token) } == "RoleSessionName")
        #expect(r2 { () throws(CredentialsError) in try STSRequestForm.assumeRoleWithWebIdentity(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "ab", webIdentityToken: OAuthSecret("tok\n")) } == "WebIdentityToken")
        #expect(r2 { () throws(CredentialsError) in try STSRequestForm.assumeRoleWithWebIdentity(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "ab", webIdentityToken: token, durationSeconds: 899) } == "DurationSeconds")
        #expect(r2 { () throws(CredentialsError) in try STSRequestForm.assumeRoleWithWebIdentity(roleARN: "arn\r\n", sessionName: "ab", webIdentityToken: token) } == "RoleArn")
    }

    @Test func awsAssumeRoleForm() throws {
        let r = try STSRequestForm.assumeRole(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "bearerd", externalID: "ext:id/1", durationSeconds: 900)
        #expect(String(decoding: r.body, as: UTF8.self) == "Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fdemo&RoleSessionName=bearerd&ExternalId=ext%3Aid%2F1&DurationSeconds=900")
        #expect(reason { () throws(CredentialsError) in try STSRequestForm.assumeRole(roleARN: "arn:aws:iam::123456789012:role/demo", sessionName: "bearerd", externalID: "x") }?.field == "ExternalId")
    }

    @Test func aliyunOIDCForm() throws {
        let r = try STSRequestForm.aliyunAssumeRoleWithOIDC(roleARN: "acs:ram::113511544585:role/testoidc",
                                                            oidcProviderARN: "acs:ram::113511544585:oidc-provider/TestOidcIdp",
                                                            oidcToken: OAuthSecret("eyJraWQiOiJKQzl3eHpyaHFKMGd0"), sessionName: "bearerd",
                                                            durationSeconds: 3600, timestamp: 1_795_939_200)
        #expect(String(decoding: r.body, as: UTF8.self) == "Action=AssumeRoleWithOIDC&Version=2015-04-01&Format=JSON&Timestamp=2026-11-29T08%3A00%3A00Z&RoleArn=acs%3Aram%3A%3A113511544585%3Arole%2Ftestoidc&OIDCProviderArn=acs%3Aram%3A%3A113511544585%3Aoidc-provider%2FTestOidcIdp&OIDCToken=eyJraWQiOiJKQzl3eHpyaHFKMGd0&RoleSessionName=bearerd&DurationSeconds=3600")
        #expect(r.header("Accept") == "application/json")
        let body = String(decoding: r.body, as: UTF8.self)
        #expect(!body.contains("Signature") && !body.contains("AccessKeyId"))
        let noTime = try STSRequestForm.aliyunAssumeRoleWithOIDC(roleARN: "acs:ram::113511544585:role/testoidc",
                                                                 oidcProviderARN: "acs:ram::113511544585:oidc-provider/TestOidcIdp",
                                                                 oidcToken: OAuthSecret("abcd"), sessionName: "ab")
        #expect(!String(decoding: noTime.body, as: UTF8.self).contains("Timestamp"))
        #expect(reason { () throws(CredentialsError) in
            try STSRequestForm.aliyunAssumeRoleWithOIDC(roleARN: "acs:ram::113511544585:role/testoidc", oidcProviderARN: "acs:ram::113511544585:oidc-provider/TestOidcIdp",
                                                        oidcToken: OAuthSecret("abc"), sessionName: "ab")
        }?.field == "OIDCToken")
        #expect(reason { () throws(CredentialsError) in
            try STSRequestForm.aliyunAssumeRoleWithOIDC(roleARN: "acs:ram::113511544585:role/testoidc", oidcProviderARN: "acs:ram::113511544585:oidc-provider/TestOidcIdp",
                                                        oidcToken: OAuthSecret("abcd"), sessionName: "a+b")
        }?.field == "RoleSessionName")
    }
}

extension String {
    fileprivate func replacingFirst(_ target: String, with replacement: String) -> String {
        replacing(target, with: replacement, maxReplacements: 1)
    }
}
