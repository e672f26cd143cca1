#!/usr/bin/env python3
"""A real gRPC server and client (grpcio) for bearerd's end-to-end tests.

server: service bearerd.test.Echo on 127.0.0.1 (cleartext h2c), raw-bytes messages (no protoc):
  Unary          echoes the request
  ServerStream   request: ASCII n -> n messages "msg-0".."msg-{n-1}"
  ClientStream   all request messages joined with "," -> one message
  Bidi           echoes each message as it arrives
  Fail           aborts PERMISSION_DENIED "nope" (grpc-message passes through)
Every call reads the `authorization` metadata: missing -> UNAUTHENTICATED "no token"; equal to
`Bearer <t>` for a --reject-token t -> UNAUTHENTICATED "token rejected" (trailers-only: nothing
was sent); otherwise trailing metadata x-seen-authorization and x-call-count are set.
Prints `READY <port>` when listening; exits when stdin closes. GET-free: a plain gRPC server.
--dpop: every call must carry `authorization: DPoP <token>` (a token bound with cnf.jkt by
oauth_server.py) and its own `dpop` proof (dpop_common.verify_proof: htm POST, htu
http://127.0.0.1:<port>/<service>/<method>, ath, a jti never seen, the key = the token's jkt);
else UNAUTHENTICATED with the reason. Trailing metadata then adds x-dpop-jti and x-dpop-jkt.

client: one call against --target, prints one JSON line:
  {"ok": bool, "code": "OK", "details": str, "messages": [...], "trailers": {...}}
"""
import argparse
import json
import sys
import threading
from concurrent import futures

import grpc

SERVICE = "bearerd.test.Echo"
ident = lambda b: b  # noqa: E731 raw bytes in and out


class State:
    def __init__(self, reject, dpop=False):
        self.dpop = dpop
        self.port = 0
        self.reject = set(reject or [])
        self.lock = threading.Lock()
        self.calls = 0
        self.rejected = 0

    def check(self, context, name=""):
        md = dict(context.invocation_metadata())
        extra = ()
        if self.dpop:
            extra = self.check_dpop(context, md, name)
        auth = md.get("authorization")
        with self.lock:
            self.calls += 1
            n = self.calls
        if auth is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")
        if auth.startswith("Bearer ") and auth[len("Bearer "):] in self.reject:
            with self.lock:
                self.rejected += 1
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "token rejected")
        context.set_trailing_metadata((("x-seen-authorization", auth), ("x-call-count", str(n))) + extra)

    def check_dpop(self, context, md, name):
        import dpop_common  # only with --dpop (joserfc)

        if not hasattr(self, "jtis"):
            self.jtis = dpop_common.JtiCache()
        auth = md.get("authorization") or ""
        if not auth.startswith("DPoP "):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization is not DPoP")
        token = auth[len("DPoP "):]
        bound = dpop_common.token_binding(token)
        htu = "http://127.0.0.1:%d/%s/%s" % (self.port, SERVICE, name)
        try:
            claims, jkt = dpop_common.verify_proof(md.get("dpop"), "POST", htu, self.jtis, access_token=token)
        except dpop_common.ProofError as e:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "dpop: " + e.description)
        if bound is None or jkt != bound:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "dpop: the proof's key is not the token's cnf.jkt")
        return (("x-dpop-jti", claims["jti"]), ("x-dpop-jkt", jkt))


def serve(args):
    state = State(args.reject_token, args.dpop)

    def unary(request, context):
        state.check(context, "Unary")
        return request

    def server_stream(request, context):
        state.check(context, "ServerStream")
        for i in range(int(request.decode() or "0")):
            yield f"msg-{i}".encode()

    def client_stream(request_iterator, context):
        state.check(context, "ClientStream")
        return b",".join(request_iterator)

    def bidi(request_iterator, context):
        state.check(context, "Bidi")
        for m in request_iterator:
            yield m

    def fail(request, context):
        state.check(context, "Fail")
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "nope")

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, ident, ident),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream, ident, ident),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream, ident, ident),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi, ident, ident),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, ident, ident),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    state.port = port
    server.start()
    print(f"READY {port}", flush=True)
    sys.stdin.read()  # until the test closes stdin (or dies)
    server.stop(grace=1)


def call(args):
    channel = grpc.insecure_channel(args.target, options=[("grpc.max_receive_message_length", 64 << 20),
                                                          ("grpc.max_send_message_length", 64 << 20)])
    method = lambda name, kind: getattr(channel, kind)(f"/{SERVICE}/{name}", request_serializer=ident,  # noqa: E731
                                                       response_deserializer=ident)
    payload = (b"p" * args.payload_bytes) if args.payload_bytes else b"hello"
    metadata = [("authorization", args.authorization)] if args.authorization else None
    out = {"ok": False, "code": "", "details": "", "messages": [], "trailers": {}}

    def show(m):
        return len(m) if args.payload_bytes else m.decode()

    try:
        if args.call == "unary":
            resp, c = method("Unary", "unary_unary").with_call(payload, timeout=20, metadata=metadata)
            out["messages"] = [show(resp)]
        elif args.call == "fail":
            resp, c = method("Fail", "unary_unary").with_call(payload, timeout=20, metadata=metadata)
        elif args.call == "server_stream":
            c = method("ServerStream", "unary_stream")(str(args.count).encode(), timeout=20, metadata=metadata)
            out["messages"] = [m.decode() for m in c]
        elif args.call == "client_stream":
            msgs = (f"m{i}".encode() for i in range(args.count))
            resp, c = method("ClientStream", "stream_unary").with_call(msgs, timeout=20, metadata=metadata)
            out["messages"] = [resp.decode()]
        elif args.call == "bidi":
            c = method("Bidi", "stream_stream")((f"b{i}".encode() for i in range(args.count)), timeout=20, metadata=metadata)
            out["messages"] = [m.decode() for m in c]
        out["ok"] = True
        out["code"] = c.code().name
        out["details"] = c.details() or ""
        out["trailers"] = {k: v for k, v in (c.trailing_metadata() or ())}
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details() or ""
        out["trailers"] = {k: v for k, v in (e.trailing_metadata() or ())}
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--reject-token", action="append")
    s.add_argument("--dpop", action="store_true")
    c = sub.add_parser("client")
    c.add_argument("--target", required=True)
    c.add_argument("--call", required=True, choices=["unary", "server_stream", "client_stream", "bidi", "fail"])
    c.add_argument("--count", type=int, default=3)
    c.add_argument("--payload-bytes", type=int, default=0)
    c.add_argument("--authorization")
    args = p.parse_args()
    serve(args) if args.mode == "server" else call(args)


if __name__ == "__main__":
    main()
