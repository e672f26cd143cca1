import Dispatch
import BearerdIO
import BearerdOAuth
#if canImport(Glibc)
import Glibc
#endif

/// Runs the helper of a `grant: exec` session: argv without a shell (`posix_spawnp`), stdin
/// `/dev/null`, stdout read up to `maxOutput`, stderr up to 64 KiB, killed (SIGKILL) when
/// `timeout` passes. Blocking: call it off every loop (the driver uses a global queue).
///
/// The child starts with an empty signal mask and default dispositions for every signal
/// bearerd changes (it blocks SIGTERM/SIGINT/SIGHUP for its signal thread and ignores SIGPIPE):
/// a helper must behave as if started from a shell.
enum CommandRunner {
    struct Outcome: Sendable {
        /// Exit status (0…255), or the negated signal number that ended the child.
        var status: Int32
        var stdout: [UInt8]
        var stderr: [UInt8]
        var timedOut: Bool
        /// stdout went past `maxOutput` (the child was killed).
        var outputTooLarge: Bool
    }

    static let maxOutput = 1 << 20

    /// A helper's run as the sessions judge it before reading its output: `.success` when it
    /// exited 0 with its output whole; else the failure. A program that cannot start, or prints
    /// over 1 MiB, is permanent; a timeout, a non-zero exit or a signal is retried. `kind`
    /// prefixes the reasons (`token.exec_exit`, `credentials.exec_timeout`, …).
    static func judged(_ run: Result<Outcome, StartFailure>, program: String, timeout: Duration,
                       kind: String) -> Result<Outcome, TokenEndpointFailure> {
        switch run {
        case .failure(let start):
            return .failure(TokenEndpointFailure(classification: .permanent, reason: "\(kind).exec_failed", errorDescription: start.message))
        case .success(let o) where o.outputTooLarge:
            return .failure(TokenEndpointFailure(classification: .permanent, reason: "token.response_too_large",
                                                 errorDescription: "\(program) printed more than 1 MiB"))
        case .success(let o) where o.timedOut:
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "\(kind).exec_timeout",
                                                 errorDescription: "\(program) did not finish within \(timeout)"))
        case .success(let o) where o.status != 0:
            let how = o.status < 0 ? "was killed by signal \(-o.status)" : "exited with status \(o.status)"
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "\(kind).exec_exit", errorDescription: "\(program) \(how)"))
        case .success(let o):
            return .success(o)
        }
    }

    /// Initialises `attr` so the child starts with an empty signal mask and default dispositions
    /// for the signals bearerd blocks or ignores (SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD).
    static func cleanSignalState(_ attr: inout posix_spawnattr_t) {
        posix_spawnattr_init(&attr)
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attr, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for s in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD] { sigaddset(&defaults, s) }
        posix_spawnattr_setsigdefault(&attr, &defaults)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    }
    static let maxErrorOutput = 64 * 1024

    /// Why the helper did not start.
    struct StartFailure: Error, Sendable {
        var message: String
    }

    /// A pipe whose ends are close-on-exec (the child gets them only through dup2).
    private static func cloexecPipe() -> [Int32]? {
        var p: [Int32] = [-1, -1]
        guard pipe(&p) == 0 else { return nil }
        for fd in p { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        return p
    }

    /// Runs `argv`; a failure to start (no such program, no pipes) is `.failure`.
    static func run(_ argv: [String], timeout: Duration) -> Result<Outcome, StartFailure> {
        guard let program = argv.first else { return .failure(StartFailure(message: "empty command")) }
        guard let outPipe = cloexecPipe() else { return .failure(StartFailure(message: "pipe: \(String(cString: strerror(errno)))")) }
        guard let errPipe = cloexecPipe() else {
            close(outPipe[0]); close(outPipe[1])
            return .failure(StartFailure(message: "pipe: \(String(cString: strerror(errno)))"))
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2)

        var attr = posix_spawnattr_t()
        CommandRunner.cleanSignalState(&attr)
        defer { posix_spawnattr_destroy(&attr) }

        let cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        defer { for p in cArgs { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawnp(&pid, program, &actions, &attr, cArgs, environ)
        close(outPipe[1])
        close(errPipe[1])
        guard rc == 0 else {
            close(outPipe[0]); close(errPipe[0])
            return .failure(StartFailure(message: "cannot start \(program): \(String(cString: strerror(rc)))"))
        }

        var outcome = Outcome(status: 0, stdout: [], stderr: [], timedOut: false, outputTooLarge: false)
        let deadline = monotonicNanos() &+ UInt64(max(0, timeout.nanosecondsClamped))
        var fds = [pollfd(fd: outPipe[0], events: Int16(POLLIN), revents: 0), pollfd(fd: errPipe[0], events: Int16(POLLIN), revents: 0)]
        var open = 2
        var buf = [UInt8](repeating: 0, count: 16 * 1024)
        var killed = false
        while open > 0 {
            let now = monotonicNanos()
            if now >= deadline && !killed {
                outcome.timedOut = true
                kill(pid, SIGKILL)
                killed = true
            }
            let waitMs = killed ? 1000 : Int32(clamping: (deadline &- now) / 1_000_000 + 1)
            let n = poll(&fds, 2, waitMs)
            if n < 0 {
                if errno == EINTR { continue }
                break
            }
            if n == 0 {
                if killed { break }  // a grandchild holds the pipes open; stop reading
                continue
            }
            for i in 0..<2 where fds[i].fd >= 0 && fds[i].revents != 0 {
                let r = buf.withUnsafeMutableBytes { read(fds[i].fd, $0.baseAddress, $0.count) }
                if r > 0 {
                    if i == 0 {
                        outcome.stdout.append(contentsOf: buf[0..<r])
                        if outcome.stdout.count > maxOutput && !killed {
                            outcome.outputTooLarge = true
                            kill(pid, SIGKILL)
                            killed = true
                        }
                    } else if outcome.stderr.count < maxErrorOutput {
                        outcome.stderr.append(contentsOf: buf[0..<min(r, maxErrorOutput - outcome.stderr.count)])
                    }
                } else if r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN) {
                    close(fds[i].fd)
                    fds[i].fd = -1
                    open -= 1
                }
            }
        }
        for f in fds where f.fd >= 0 { close(f.fd) }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED / WEXITSTATUS / WTERMSIG spelled out (macros Swift does not import).
        if status & 0x7F == 0 {
            outcome.status = (status >> 8) & 0xFF
        } else {
            outcome.status = -(status & 0x7F)
        }
        return .success(outcome)
    }
}

/// Opens a URL in the user's browser for `bearerd login`: `$BROWSER` (a command; the URL is
/// added as its last argument; words split on spaces and tabs) or `xdg-open`. Started detached with a
/// clean signal state; not waited for.
public enum BrowserLauncher {
    /// Nil when started; else why not.
    public static func open(_ url: String, environment: [String: String]) -> String? {
        var argv: [String]
        let words = environment["BROWSER"].map { $0.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init) } ?? []
        if !words.isEmpty {
            argv = words
        } else {
            argv = ["xdg-open"]
        }
        argv.append(url)
        var attr = posix_spawnattr_t()
        CommandRunner.cleanSignalState(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // The browser's chatter must not mix with our prompt: its output goes to /dev/null.
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        defer { for p in cArgs { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawnp(&pid, argv[0], &actions, &attr, cArgs, environ)
        return rc == 0 ? nil : "cannot start \(argv[0]): \(String(cString: strerror(rc)))"
    }
}
