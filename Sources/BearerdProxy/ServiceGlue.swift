import BearerdIO
import BearerdService
import BearerdSessions

/// The running server as the service layer sees it: the admin endpoints' status source.
extension BearerdServer: AdminStatusSource {
    public var lifecyclePhase: ServerLifecycle.Phase { lifecycle.phase }
    public var acceptBudgetSnapshot: AcceptBudget.Snapshot? { acceptBudget.snapshot }
}

extension SystemdService.Probe {
    /// The probe of a running server: its configured listener addresses, its sessions (a session
    /// lacks a token until it has obtained one: generation 0 and no usable token) and its loops.
    public init(server: BearerdServer) {
        let sessions = server.sessions
        self.init(
            listeners: { server.listenerSummary },
            sessionCount: { sessions.sessionNames.count },
            shortfalls: {
                let now = monotonicNanos()
                return sessions.sessionNames.compactMap { name -> SessionShortfall? in
                    guard let d = sessions.session(named: name) else { return nil }
                    if d.usableToken(now: now) != nil { return nil }
                    let s = d.snapshot  // generation and last failure read together
                    if s.generation > 0 && s.lastFailure == nil { return nil }
                    return SessionShortfall(session: name, detail: s.lastFailure)
                }
            },
            loops: server.group.loops)
    }
}
