import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// `listen:` entries with access control, top-level `allow_remote`/`allowed_hosts`, `log:`,
/// `shutdown_grace` and `startup_timeout` (docs/architecture.md §4).
@Suite("Config: listeners, access control, log")
struct ConfigListenerTests {
    @Test func plainAddressesGetSafeDefaults() throws {
        let config = try parseConfig("listen: [127.0.0.1:8080, unix:/run/b.sock]\n" + minimalRoute)
        #expect(config.listeners.count == 2)
        let tcp = config.listeners[0], unix = config.listeners[1]
        #expect(tcp.isLoopback && tcp.checksHost && !tcp.allowRemote)
        #expect(unix.mode == 0o660 && unix.owner == nil && unix.allowUIDs == nil && unix.allowGIDs == nil)
        #expect(unix.admits(uid: 12345, gid: 12345))
        #expect(config.log == LogConfig())
        #expect(config.frontendTimeouts.shutdownGrace == .seconds(10))
        #expect(config.startupTimeout == .seconds(30))
    }

    @Test func unixListenerMapping() throws {
        let config = try parseConfig("""
            listen:
              - address: unix:/run/bearerd/api.sock
                name: api
                mode: 0600
                owner: root
                group: "0"
                allow_uids: [root, 1000]
                allow_gids: [4242]
              - unix: /run/bearerd/other.sock
                mode: 660
            """ + "\n" + minimalRoute)
        let l = config.listeners[0]
        #expect(l.address == .unix(path: "/run/bearerd/api.sock"))
        #expect(l.name == "api")
        #expect(l.mode == 0o600)
        #expect(l.owner == 0 && l.group == 0)
        #expect(l.allowUIDs == [0, 1000] && l.allowGIDs == [4242])
        #expect(l.admits(uid: 1000, gid: 1))
        #expect(l.admits(uid: 7, gid: 4242))
        #expect(!l.admits(uid: 7, gid: 7))
        #expect(config.listeners[1].address == .unix(path: "/run/bearerd/other.sock"))
        #expect(config.listeners[1].mode == 0o660)
    }

    @Test func nonLoopbackNeedsAllowRemote() throws {
        let errors = configErrors("listen: [0.0.0.0:8080, \"[::]:8080\", 127.0.0.1:8081]\n" + minimalRoute)
        #expect(errors.count == 2)
        #expect(errors[0].hasPrefix("bearerd.yaml:1: listen[0]: 0.0.0.0:8080 is not a loopback address"))
        #expect(errors[0].contains("allow_remote: true"))
        #expect(errors[1].hasPrefix("bearerd.yaml:1: listen[1]: [::]:8080 is not a loopback address"))

        let one = try parseConfig("listen:\n  - address: 0.0.0.0:8080\n    allow_remote: true\n" + minimalRoute)
        #expect(one.listeners[0].allowRemote && !one.listeners[0].isLoopback && !one.listeners[0].checksHost)
        let top = try parseConfig("allow_remote: true\nlisten: [0.0.0.0:8080, 127.0.0.1:9]\n" + minimalRoute)
        #expect(top.listeners.allSatisfy { $0.allowRemote })
    }

    @Test func allowedHosts() throws {
        let config = try parseConfig("""
            allowed_hosts: [API.internal]
            listen:
              - 127.0.0.1:8080
              - address: 127.0.0.1:8081
                allowed_hosts: ["*"]
              - address: "[::1]:8082"
                allowed_hosts: ["[::1]", app.localhost]
            """ + "\n" + minimalRoute)
        #expect(config.listeners[0].allowedHosts == ["api.internal"])
        #expect(config.listeners[0].checksHost)
        #expect(!config.listeners[1].checksHost)
        #expect(config.listeners[2].allowedHosts == ["::1", "app.localhost"])
        #expect(configErrors("listen:\n  - address: 127.0.0.1:1\n    allowed_hosts: [\"a b\"]\n" + minimalRoute)
                == ["bearerd.yaml:3: listen[0].allowed_hosts[0]: expected a host name without port (or * for any), got \"a b\""])
    }

    @Test func allowedOrigins() throws {
        let config = try parseConfig("""
            allowed_origins: [HTTPS://App.Example.com:443]
            listen:
              - 127.0.0.1:8080
              - address: 127.0.0.1:8081
                allowed_origins: ["http://localhost:3000", "http://[::1]:3000", "http://localhost:3000"]
              - address: unix:/run/b.sock
                allowed_origins: []
            """ + "\n" + minimalRoute)
        #expect(config.listeners[0].allowedOrigins == ["https://app.example.com"])
        #expect(config.listeners[1].allowedOrigins == ["http://localhost:3000", "http://[::1]:3000"])
        #expect(config.listeners[2].allowedOrigins == [])
        #expect(BrowserGuard(scheme: .http, allowedOrigins: config.listeners[1].allowedOrigins).allowedOrigins == ["http://localhost:3000", "http://[::1]:3000"])
        // Without listen: the default listener takes the top-level list; without either, none.
        #expect(try parseConfig("allowed_origins: [\"http://localhost:5173\"]\n" + minimalRoute).listeners[0].allowedOrigins
                == ["http://localhost:5173"])
        #expect(try parseConfig(minimalRoute).listeners[0].allowedOrigins == [])
        // A change is a change of the listener (a reload gives it a new policy).
        var other = config.listeners[1]
        other.allowedOrigins = []
        #expect(other != config.listeners[1])
    }

    @Test func allowedOriginsErrorsNameFileLineAndKey() {
        let errors = configErrors("""
            allowed_origins: "*"
            listen:
              - address: 127.0.0.1:8080
                allowed_origins:
                  - "*"
                  - https://*.example.com
                  - "null"
                  - https://app.example.com/
                  - https://app.example.com/ui?x=1
                  - app.example.com
                  - http://app.example.com:99999
                  - {origin: x}
            """ + "\n" + minimalRoute)
        #expect(errors.count == 9)
        #expect(errors[0].hasPrefix("bearerd.yaml:1: allowed_origins[0]: a wildcard is not accepted"))
        #expect(errors[1].hasPrefix("bearerd.yaml:5: listen[0].allowed_origins[0]: a wildcard is not accepted: with it any web page could"))
        #expect(errors[2].hasPrefix("bearerd.yaml:6: listen[0].allowed_origins[1]: a wildcard is not accepted"))
        #expect(errors[3].hasPrefix("bearerd.yaml:7: listen[0].allowed_origins[2]: null is not accepted"))
        #expect(errors[4] == "bearerd.yaml:8: listen[0].allowed_origins[3]: an origin has no path, query or fragment: write https://app.example.com, got \"https://app.example.com/\"")
        #expect(errors[5] == "bearerd.yaml:9: listen[0].allowed_origins[4]: an origin has no path, query or fragment: write https://app.example.com, got \"https://app.example.com/ui?x=1\"")
        #expect(errors[6] == "bearerd.yaml:10: listen[0].allowed_origins[5]: expected an origin scheme://host[:port], such as https://app.example.com or http://localhost:3000, got \"app.example.com\"")
        #expect(errors[7].hasPrefix("bearerd.yaml:11: listen[0].allowed_origins[6]: expected an origin scheme://host[:port]"))
        #expect(errors[8].hasPrefix("bearerd.yaml:12: listen[0].allowed_origins[7]: expected an origin such as https://app.example.com, got "))
    }

    @Test func listenerErrorsNameFileLineAndKey() {
        let errors = configErrors("""
            listen:
              - address: 127.0.0.1:8080
                mode: 0600
              - address: unix:/run/x.sock
                allow_remote: true
                mode: 0999
                owner: no-such-user-bearerd
                allow_gids: [no-such-group-bearerd]
              - unix: relative.sock
              - adress: 127.0.0.1:1
            """ + "\n" + minimalRoute)
        #expect(errors == [
            "bearerd.yaml:3: listen[0].mode: applies to unix: listeners only",
            "bearerd.yaml:5: listen[1].allow_remote: applies to TCP listeners only",
            "bearerd.yaml:6: listen[1].mode: expected an octal file mode such as 0660 (at most 0777), got \"0999\"",
            "bearerd.yaml:7: listen[1].owner: no user named 'no-such-user-bearerd' on this system",
            "bearerd.yaml:8: listen[1].allow_gids[0]: no group named 'no-such-group-bearerd' on this system",
            "bearerd.yaml:9: listen[2].unix: a Unix socket path must be absolute, got \"unix:relative.sock\"",
            "bearerd.yaml:10: listen[3].adress: unknown key (did you mean 'address'?)",
            "bearerd.yaml:10: listen[3].address: missing required key (e.g. address: unix:/run/bearerd/api.sock or address: 127.0.0.1:8080)",
        ])
    }

    @Test func logSection() throws {
        let config = try parseConfig("log:\n  format: json\n  level: debug\n  access: false\n" + minimalRoute)
        #expect(config.log.format == .json && config.log.level == .debug && !config.log.access)
        #expect(config.log != LogConfig())
        #expect(configErrors("log:\n  format: xml\n" + minimalRoute)
                == ["bearerd.yaml:2: log.format: expected one of text, json, got \"xml\""])
        #expect(configErrors("log:\n  levl: info\n" + minimalRoute)
                == ["bearerd.yaml:2: log.levl: unknown key (did you mean 'level'?)"])
    }

    @Test func shutdownGraceAndStartupTimeout() throws {
        let config = try parseConfig("shutdown_grace: 3s\nstartup_timeout: 2m\n" + minimalRoute)
        #expect(config.frontendTimeouts.shutdownGrace == .seconds(3))
        #expect(config.startupTimeout == .seconds(120))
        let nested = try parseConfig("timeouts:\n  shutdown_grace: 4s\n" + minimalRoute)
        #expect(nested.frontendTimeouts.shutdownGrace == .seconds(4))
        #expect(configErrors("shutdown_grace: 3s\ntimeouts:\n  shutdown_grace: 4s\n" + minimalRoute)
                == ["bearerd.yaml:1: shutdown_grace: also set as timeouts.shutdown_grace (line 3); keep one"])
    }
}
