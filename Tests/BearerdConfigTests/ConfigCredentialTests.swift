import Foundation
import Testing
@testable import BearerdConfig

@Suite("credential: values")
struct CredentialTests {
    let sessionYAML = """
        sessions:
          partner:
            grant: client_credentials
            token_url: https://auth.example.com/token
            client_id: svc
            client_secret_file: credential:partner
            tls:
              ca_file: credential:ca.pem
              client_cert: credential:client.pem
              client_key: credential:client.key
          me:
            grant: refresh_token
            token_url: https://auth.example.com/token
            client_id: cli
            client_auth: none
            refresh_token_file: credential:me.refresh
          legacy:
            grant: password
            token_url: https://auth.example.com/token
            client_id: app
            client_auth: none
            username: u
            password_file: credential:svc-password
        state_dir: /var/lib/bearerd
        routes:
          - match: /
            upstream: https://api.example.com
            session: partner
            tls:
              ca_file: credential:upstream-ca.pem
        """

    @Test func everyFileKeyResolvesInTheCredentialsDirectory() throws {
        let config = try parseConfig(sessionYAML, environment: ["CREDENTIALS_DIRECTORY": "/run/credentials/bearerd.service"])
        let d = "/run/credentials/bearerd.service/"
        let partner = try #require(config.session(named: "partner"))
        #expect(partner.clientSecret == .file(d + "partner"))
        #expect(partner.tls?.caFile == d + "ca.pem")
        #expect(partner.tls?.clientCert == d + "client.pem")
        #expect(partner.tls?.clientKey == d + "client.key")
        #expect(config.session(named: "me")?.refreshTokenFile == d + "me.refresh")
        #expect(config.session(named: "legacy")?.password == .file(d + "svc-password"))
        #expect(config.routes.first?.tls?.caFile == d + "upstream-ca.pem")
    }

    @Test func missingCredentialsDirectoryIsAnErrorAtTheLine() {
        let errors = configErrors(sessionYAML)
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:6: sessions.partner.client_secret_file: credential:partner needs $CREDENTIALS_DIRECTORY, which is not set") })
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:8: sessions.partner.tls.ca_file: credential:ca.pem needs $CREDENTIALS_DIRECTORY") })
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:16: sessions.me.refresh_token_file: credential:me.refresh needs") })
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:23: sessions.legacy.password_file: credential:svc-password needs") })
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:30: routes[0].tls.ca_file: credential:upstream-ca.pem needs") })
    }

    @Test(arguments: ["credential:a/b", "credential:", "credential:..", "credential:../x"])
    func badCredentialNamesAreRefused(value: String) {
        let yaml = """
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: svc
                client_secret_file: "\(value)"
            \(minimalRoute)
            """
        let errors = configErrors(yaml, environment: ["CREDENTIALS_DIRECTORY": "/run/credentials/x"])
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:6: sessions.partner.client_secret_file: expected credential:NAME with a credential name") }, "\(errors)")
    }

    @Test func checkedFilesAreReadFromTheCredentialsDirectory() throws {
        let dir = try TemporaryDirectory()
        try dir.write("partner", "s3cret\n")
        let yaml = """
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: svc
                client_secret_file: credential:partner
            \(minimalRoute)
            """
        let config = try parseConfig(yaml, environment: ["CREDENTIALS_DIRECTORY": dir.path], checkFiles: true)
        let source = try #require(config.session(named: "partner")?.clientSecret)
        #expect(try ConfigLoader.resolveSecret(source, environment: [:]).value == "s3cret")
        let missing = configErrors(yaml.replacingOccurrences(of: "credential:partner", with: "credential:nope"),
                                   environment: ["CREDENTIALS_DIRECTORY": dir.path], checkFiles: true)
        #expect(missing.contains { $0.contains("sessions.partner.client_secret_file") && $0.contains(dir.path + "/nope") }, "\(missing)")
    }

    @Test func otherPathKeysDoNotTakeCredentials() throws {
        let config = try parseConfig("state_dir: credential:x\n" + minimalRoute, environment: ["CREDENTIALS_DIRECTORY": "/c"])
        #expect(config.stateDir != "/c/x")
    }
}
