import ArgumentParser
import BearerdOAuth
import Foundation
import BearerdConfig
import BearerdSessions

/// `bearerd login -c FILE SESSION` (docs/architecture.md §3): a person signs in once, and `run` and `token`
/// keep the session alive with the refresh token stored in `state_dir`.
///
/// `grant: authorization_code`: PKCE S256 and `state` (RFC 7636, RFC 6749 §10.12), a loopback
/// redirect on 127.0.0.1 with a port chosen at run time (RFC 8252 §7.3) or the session's fixed
/// loopback `redirect_uri:`, the URL opened with
/// `$BROWSER` or `xdg-open` and always printed on stderr. `grant: device_code` (RFC 8628): the
/// user code printed, the token endpoint polled at the server's interval (`slow_down` adds 5 s).
struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sign a person in for a session (grant authorization_code or device_code) and store its refresh token in state_dir.")
    @OptionGroup var configOption: ConfigOption
    @Argument(help: "The session name, as in the configuration's `sessions:`.") var session: String
    @Flag(help: "Only print the sign-in URL; do not open a browser.") var noBrowser = false
    @Option(help: "How long to wait for the sign-in, in seconds (default 300).") var timeout: Int = 300

    func run() throws {
        var stderr = FileHandle.standardError
        let config = try configOption.load(orExit: 2)
        guard let s = config.session(named: session) else {
            print("\(configOption.path): no session named '\(session)' (known: \(config.sessions.map(\.name).joined(separator: ", ")))", to: &stderr)
            throw ExitCode(2)
        }
        guard s.grant.isPersonal else {
            print("bearerd login: session \(session) has grant \(s.grant.rawValue); login is for grant authorization_code or device_code", to: &stderr)
            throw ExitCode(2)
        }
        let signIn: SignIn
        do {
            signIn = try SignIn(config: config, session: s, environment: ProcessInfo.processInfo.environment)
        } catch {
            printErrors(error)
            throw ExitCode(2)
        }
        let wait = Duration.seconds(max(1, min(timeout, 3600)))
        let result: Result<TokenGrant, SignIn.Failure>
        switch s.grant {
        case .deviceCode: result = deviceFlow(signIn, wait: wait)
        default: result = authorizationCodeFlow(signIn, wait: wait)
        }
        switch result {
        case .failure(let failure):
            print("bearerd login: \(session): \(failure.message)", to: &stderr)
            throw ExitCode(1)
        case .success(let grant):
            do throws(SignIn.Failure) {
                try signIn.store(grant)
            } catch {
                print("bearerd login: \(session): \(error.message)", to: &stderr)
                throw ExitCode(1)
            }
            print("Signed in: session \(session) is stored in \(signIn.statePath); `bearerd run` and `bearerd token` keep it alive "
                  + "(a bearerd already running picks it up on its next request).", to: &stderr)
        }
    }

    private func authorizationCodeFlow(_ signIn: SignIn, wait: Duration) -> Result<TokenGrant, SignIn.Failure> {
        var stderr = FileHandle.standardError
        let redirect: LoopbackRedirect
        do throws(SignIn.Failure) {
            redirect = try LoopbackRedirect(fixed: signIn.session.redirectURI)
        } catch {
            return .failure(error)
        }
        var g = SystemRandomNumberGenerator()
        let pkce = PKCE(random: (0..<32).map { _ in UInt8.random(in: 0...255, using: &g) })
        let state = Base64.encodeURL((0..<16).map { _ in UInt8.random(in: 0...255, using: &g) })
        // OIDC Core §3.1.2.1: a fresh nonce whenever the scope asks for openid, checked in the id_token.
        let nonce = OpenIDNonce.isRequested(scope: signIn.session.scope)
            ? OpenIDNonce(random: (0..<16).map { _ in UInt8.random(in: 0...255, using: &g) }) : nil
        guard let url = signIn.authorizationURL(redirectURI: redirect.redirectURI, state: state, pkce: pkce, nonce: nonce) else {
            return .failure(SignIn.Failure(message: "no authorization endpoint: set authorization_url (with token_url) or issuer"))
        }
        print("Open this URL to sign in: \(url)", to: &stderr)
        if !noBrowser, let problem = BrowserLauncher.open(url, environment: ProcessInfo.processInfo.environment) {
            print("(could not open a browser: \(problem); open the URL yourself)", to: &stderr)
        }
        var outcome: Result<TokenGrant, SignIn.Failure> = .failure(SignIn.Failure(message: "no sign-in within \(wait)"))
        let callback = redirect.waitForCallback(timeout: wait) { query in
            if let error = query["error"] {
                let description = query["error_description"].map { ": \($0)" } ?? ""
                outcome = .failure(SignIn.Failure(message: "the sign-in was refused: \(error)\(description)", oauthError: error))
                return (400, "<h1>Sign-in refused</h1><p>\(Self.escape(error + description))</p><p>bearerd login has stopped; run it again to retry.</p>")
            }
            // RFC 6749 §10.12: a callback without our state is not ours (CSRF).
            guard query["state"] == state else {
                outcome = .failure(SignIn.Failure(message: "the callback's state does not match this sign-in (a stale or forged redirect)"))
                return (400, "<h1>Sign-in failed</h1><p>The answer does not belong to this sign-in.</p>")
            }
            guard let code = query["code"], !code.isEmpty else {
                outcome = .failure(SignIn.Failure(message: "the callback carries no code"))
                return (400, "<h1>Sign-in failed</h1><p>No authorization code.</p>")
            }
            outcome = signIn.exchange(.authorizationCode(code: OAuthSecret(code), redirectURI: redirect.redirectURI, codeVerifier: pkce.verifier), nonce: nonce)
            switch outcome {
            case .success: return (200, "<h1>Signed in</h1><p>bearerd has your session. You can close this tab.</p>")
            case .failure(let f): return (400, "<h1>Sign-in failed</h1><p>\(Self.escape(f.message))</p>")
            }
        }
        if callback == nil, case .failure = outcome {
            // Servers that compare redirect URIs exactly refuse a port chosen at run time and never redirect.
            let hint = signIn.session.redirectURI == nil
                ? "if it compares redirect URIs exactly, register one and set it as redirect_uri: (e.g. http://127.0.0.1:8765/callback)"
                : "check that the client is registered with exactly this redirect URI"
            return .failure(SignIn.Failure(message: "no sign-in within \(wait) (nothing came back to \(redirect.redirectURI)); "
                                           + "the server may have refused the redirect URI: \(hint)"))
        }
        return outcome
    }

    private func deviceFlow(_ signIn: SignIn, wait: Duration) -> Result<TokenGrant, SignIn.Failure> {
        var stderr = FileHandle.standardError
        let device: SignIn.DeviceAuthorization
        switch signIn.startDeviceAuthorization() {
        case .failure(let f): return .failure(f)
        case .success(let d): device = d
        }
        print("Open \(device.verificationURI) and enter code \(device.userCode)", to: &stderr)
        if let complete = device.verificationURIComplete { print("(or open \(complete))", to: &stderr) }
        var interval = device.interval
        let limit = min(device.expiresIn, Int(wait.components.seconds))
        let start = Date()
        while Date().timeIntervalSince(start) < Double(limit) {
            Thread.sleep(forTimeInterval: Double(interval))
            switch signIn.exchange(.deviceCode(device.deviceCode)) {
            case .success(let grant):
                return .success(grant)
            case .failure(let f):
                switch f.oauthError {
                case "authorization_pending": continue
                case "slow_down": interval = min(interval + 5, 60)  // RFC 8628 §3.5
                case "expired_token": return .failure(SignIn.Failure(message: "the code expired before anyone entered it; run bearerd login again"))
                case "access_denied": return .failure(SignIn.Failure(message: "the sign-in was refused (access_denied)"))
                default: return .failure(f)
                }
            }
        }
        return .failure(SignIn.Failure(message: "nobody entered the code within \(limit) s"))
    }

    static func escape(_ s: String) -> String {
        s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;").replacingOccurrences(of: ">", with: "&gt;")
    }
}
