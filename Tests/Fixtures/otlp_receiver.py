#!/usr/bin/env python3
"""An OTLP/HTTP (protobuf) trace receiver for the tracing tests, decoding with the reference
opentelemetry-proto package (PyPI), not with bearerd's own code.

    python3 otlp_receiver.py             # serve on a free loopback port, print READY <port>
    python3 otlp_receiver.py --decode F  # decode the ExportTraceServiceRequest bytes in file F, print JSON

Served:
- POST /v1/traces: the body must be an ExportTraceServiceRequest with Content-Type
  application/x-protobuf (else 415/400); every span is kept; the answer is an empty
  ExportTraceServiceResponse (200).
- GET /spans: every span received so far, as JSON (ids in lowercase hex, attributes as a
  {key: value} object, events, links, status, resource attributes).
- GET /requests: the header fields of every export request (lowercase names).

Exits when stdin closes.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

lock = threading.Lock()
spans = []
requests = []


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    raise ValueError("unexpected AnyValue " + kind)


def attributes(kvs):
    out = {}
    for kv in kvs:
        if kv.key in out:
            raise ValueError("duplicate attribute " + kv.key)
        out[kv.key] = any_value(kv.value)
    return out


def decode(body):
    """The spans of one ExportTraceServiceRequest as dicts (strict: the message must parse whole)."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    if len(req.SerializeToString()) != len(body):
        # The reference encoder writes the same fields in the same canonical form: any
        # difference in length means bytes that are not what bearerd meant.
        raise ValueError("message did not re-encode to the same length")
    out = []
    for rs in req.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({
                    "resource": resource,
                    "scope": {"name": ss.scope.name, "version": ss.scope.version},
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "trace_state": s.trace_state,
                    "flags": s.flags,
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attributes": attributes(s.attributes),
                    "events": [{"name": e.name, "time": e.time_unix_nano, "attributes": attributes(e.attributes)}
                               for e in s.events],
                    "links": [{"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex(),
                               "attributes": attributes(l.attributes)} for l in s.links],
                    "status": {"code": s.status.code, "message": s.status.message},
                })
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        with lock:
            requests.append({k.lower(): v for k, v in self.headers.items()})
        if self.path != "/v1/traces":
            return self.reply(404, b"", "text/plain")
        if self.headers.get("Content-Type") != "application/x-protobuf":
            return self.reply(415, b"", "text/plain")
        try:
            got = decode(body)
        except Exception as e:  # noqa: BLE001 - any decoding problem is the client's 400
            return self.reply(400, str(e).encode(), "text/plain")
        with lock:
            spans.extend(got)
        self.reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    def do_GET(self):
        with lock:
            if self.path == "/spans":
                data = json.dumps(spans)
            elif self.path == "/requests":
                data = json.dumps(requests)
            else:
                return self.reply(404, b"", "text/plain")
        self.reply(200, data.encode(), "application/json")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--decode":
        with open(sys.argv[2], "rb") as f:
            print(json.dumps(decode(f.read())))
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("READY %d" % server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
