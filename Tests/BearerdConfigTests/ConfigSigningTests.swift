import Testing
@testable import BearerdConfig

/// `grant: aws` / `grant: aliyun` sessions, their `credentials:` sources and a route's `sign:`
/// (docs/architecture.md §6.15): parsing, defaults, and FILE:LINE errors for every misfit.
@Suite struct ConfigSigningTests {
    static func config(_ sessions: String, route: String = "sign: { service: s3 }", session: String = "store") -> String {
        """
        sessions:
        \(sessions)
        routes:
          - match: /s3/
            upstream: https://bucket.s3.us-east-1.amazonaws.com
            session: \(session)
            \(route)
        """
    }

    @Test func webIdentityDefaultsTheRegionalSTSAndTheSessionName() throws {
        let c = try parseConfig(Self.config("""
              store:
                grant: aws
                region: eu-west-1
                credentials:
                  web_identity: { role_arn: "arn:aws:iam::123456789012:role/app", token_file: /var/run/t }
            """))
        let s = try #require(c.session(named: "store"))
        let signing = try #require(s.signing)
        #expect(s.grant == .aws)
        #expect(signing.region == "eu-west-1")
        #expect(signing.stsURL.description == "https://sts.eu-west-1.amazonaws.com/")
        #expect(signing.source == .webIdentity(.init(roleARN: "arn:aws:iam::123456789012:role/app", tokenFile: "/var/run/t",
                                                     sessionName: "bearerd", durationSeconds: nil)))
        #expect(s.tokenURL == signing.stsURL)
        let route = try #require(c.routes.first?.sign)
        #expect(route.service == "s3")
        #expect(route.payload == .unsigned)
    }

    @Test func everyAWSSourceParses() throws {
        let sources: [(String, CredentialSourceConfig)] = [
            ("assume_role: { role_arn: \"arn:aws:iam::123456789012:role/r\", access_key_id_file: /k/ak, secret_access_key_file: /k/sk, external_id: x-1, session_name: app, duration: 1h }",
             .assumeRole(.init(roleARN: "arn:aws:iam::123456789012:role/r", keys: .init(accessKeyIDFile: "/k/ak", secretAccessKeyFile: "/k/sk"),
                               externalID: "x-1", sessionName: "app", durationSeconds: 3600))),
            ("static: { access_key_id_file: /k/ak, secret_access_key_file: /k/sk, session_token_file: /k/st }",
             .staticKeys(.init(accessKeyIDFile: "/k/ak", secretAccessKeyFile: "/k/sk", sessionTokenFile: "/k/st"))),
            ("exec: [/bin/true, --profile, app]", .exec(["/bin/true", "--profile", "app"])),
            ("url: http://169.254.170.23/v1/credentials\n      url_token_file: /k/pod-token\n      url_headers: { X-Team: storage }",
             .url(.init(url: try ConfigValues.endpointURL("http://169.254.170.23/v1/credentials", allowQuery: true),
                        headers: [.init(name: "X-Team", value: "storage")], tokenFile: "/k/pod-token"))),
        ]
        for (yaml, expected) in sources {
            let c = try parseConfig(Self.config("""
                  store:
                    grant: aws
                    region: us-east-1
                    credentials:
                      \(yaml)
                """))
            #expect(c.session(named: "store")?.signing?.source == expected, "\(yaml)")
        }
        let exec = try parseConfig(Self.config("""
              store:
                grant: aws
                region: us-east-1
                credentials: { exec: [/bin/true] }
            """))
        #expect(exec.session(named: "store")?.command == ["/bin/true"])
    }

    @Test func aliyunTakesOIDCRoleAndTheSeedsVendingURL() throws {
        let c = try parseConfig(Self.config("""
              oss:
                grant: aliyun
                region: cn-hangzhou
                credentials:
                  oidc_role: { role_arn: "acs:ram::123:role/app", oidc_provider_arn: "acs:ram::123:oidc-provider/ack", token_file: /t }
              seed:
                grant: aliyun
                region: cn-shanghai
                credentials: { url: "https://app.example.com/distribute-token.json" }
            """, route: "sign: { bucket: my-bucket }", session: "oss") + """

              - match: /seed/
                upstream: https://b.oss-cn-shanghai.aliyuncs.com
                session: seed
                sign: {}
            """)
        let oss = try #require(c.session(named: "oss")?.signing)
        #expect(oss.stsURL.description == "https://sts.cn-hangzhou.aliyuncs.com/")
        #expect(oss.source == .oidcRole(.init(roleARN: "acs:ram::123:role/app", oidcProviderARN: "acs:ram::123:oidc-provider/ack", tokenFile: "/t")))
        let seed = try #require(c.session(named: "seed"))
        #expect(seed.tokenURL.description == "https://app.example.com/distribute-token.json")
        #expect(c.routes[0].sign == SignConfig(service: nil, bucket: "my-bucket", payload: .unsigned).withLine(c.routes[0].sign?.line ?? 0))
        #expect(c.routes[1].sign?.payload == .unsigned)
    }

    @Test func misfitsAreNamedWithTheirLine() {
        func errors(_ sessions: String, route: String = "sign: { service: s3 }", session: String = "store") -> String {
            configErrors(Self.config(sessions, route: route, session: session)).joined(separator: "\n")
        }
        let aws = """
              store:
                grant: aws
                region: us-east-1
                credentials: { static: { access_key_id_file: /a, secret_access_key_file: /s } }
            """
        #expect(errors("""
              store:
                grant: aws
                credentials: { static: { access_key_id_file: /a, secret_access_key_file: /s } }
            """).contains("bearerd.yaml:2: sessions.store.region: missing required key"))
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                credentials:
                  static: { access_key_id_file: /a, secret_access_key_file: /s }
                  exec: [/bin/true]
            """).contains("bearerd.yaml:7: sessions.store.credentials.exec: give exactly one source under credentials (already static at line 6)"))
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                credentials: { oidc_role: { role_arn: "acs:ram::123456789:role/r", oidc_provider_arn: "acs:ram::123456789:oidc-provider/p", token_file: /t } }
            """).contains("oidc_role is for grant aliyun"))
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                token_url: https://auth.example.com/token
                credentials: { static: { access_key_id_file: /a, secret_access_key_file: /s } }
            """).contains("bearerd.yaml:5: sessions.store.token_url: not used with grant aws"))
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                credentials: { web_identity: { role_arn: "arn:aws:iam::123456789012:role/r", token_file: /t, duration: 5m } }
            """).contains("duration: must be at least 15m"))
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                credentials: { web_identity: { role_arn: "role/r", token_file: /t } }
            """).contains("role_arn: expected an ARN starting with arn:"))
        #expect(errors("""
              store:
                grant: aws
                region: US-East-1
                credentials: { static: { access_key_id_file: /a, secret_access_key_file: /s } }
            """).contains("region: expected a region name"))
        #expect(errors(aws, route: "sign: { service: execute-api, payload: unsigned }")
            .contains("routes[0].sign.payload: payload unsigned is for S3 only"))
        #expect(errors(aws, route: "sign: { payload: signed }").contains("routes[0].sign.service: missing"))
        #expect(errors(aws, route: "inject: { header: X-Key }\n    sign: { service: s3 }").contains("routes[0].inject: a signed route carries no token"))
        #expect(errors(aws, route: "timeouts: { connect: 2s }").contains("routes[0].sign: missing: session 'store' has grant aws"))
        #expect(errors("""
              store:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: x
                client_secret: y
            """).contains("session 'store' has grant client_credentials, which gives a token; sign needs grant aws or aliyun"))
        #expect(errors("""
              store:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: x
                client_secret: y
                region: us-east-1
            """, route: "").contains("sessions.store.region: only used with grant aws or aliyun"))
        #expect(errors("""
              store:
                grant: aliyun
                region: oss-cn-hangzhou
                credentials: { url: "https://v.example.com/t.json" }
            """, route: "sign: {}").contains("give the region without the oss- prefix (cn-hangzhou)"))
        #expect(errors(aws + "\n    sinks: [{ path: /run/b/store.h, format: header }]")
            .contains("format header is for tokens; a signing session's sink holds its keys"))
        #expect(errors(aws + "\n    sinks: [{ path: /run/b/store.json, format: json }, { path: /run/b/store.cp }]") == "")
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                credentials: { web_identity: { role_arn: "arn:aws:iam::1:r", token_file: /t } }
            """).contains("role_arn: expected an ARN starting with arn: (20–2048 visible ASCII characters)"))
        #expect(errors("""
              store:
                grant: aws
                region: us-east-1
                credentials: { assume_role: { role_arn: "arn:aws:iam::123456789012:role/r", access_key_id_file: /a, secret_access_key_file: /s, external_id: "a b" } }
            """).contains("external_id: expected 2–1224 letters, digits or _+=,.@:/- (ExternalId)"))
        #expect(errors("""
              oss:
                grant: aliyun
                region: cn-hangzhou
                credentials: { oidc_role: { role_arn: "acs:ram::123456789:role/app", oidc_provider_arn: "acs:ram::123456789:oidc-provider/ack", token_file: /t, session_name: "a+b" } }
            """, route: "sign: {}", session: "oss").contains("session_name: expected 2–64 letters, digits or _.@- (RoleSessionName)"))
    }

    @Test func tokenAPITakesAnAuthorizationTokenFile() throws {
        let c = try parseConfig(Self.config("""
              store:
                grant: aws
                region: us-east-1
                credentials: { static: { access_key_id_file: /a, secret_access_key_file: /s } }
            """) + "\ntoken_api: { listen: 127.0.0.1:9902, sessions: [store], authorization_token_file: /run/b/t }")
        #expect(c.tokenAPI?.authorizationTokenFile == "/run/b/t")
    }

    @Test func filesAreCheckedWhenAsked() {
        let errors = configErrors(Self.config("""
              store:
                grant: aws
                region: us-east-1
                credentials: { static: { access_key_id_file: /nonexistent/ak, secret_access_key_file: /nonexistent/sk } }
            """), checkFiles: true).joined(separator: "\n")
        #expect(errors.contains("sessions.store.credentials.static.access_key_id_file: cannot read /nonexistent/ak"))
    }
}

extension SignConfig {
    func withLine(_ line: Int) -> SignConfig {
        var s = self
        s.line = line
        return s
    }
}
