"""A minimal OTLP/HTTP trace receiver on the official protobuf definitions
(opentelemetry-proto), for the tracing test.

Listens on 127.0.0.1 (a free port, printed as the first line of stdout), takes
POST /v1/traces with Content-Type application/x-protobuf as a collector does,
and appends every span it decodes to the file named by argv[1] as one JSON
object a line: service, name, kind, trace_id, span_id, parent_span_id (hex),
start and end (ns), attributes. Anything else is refused as a collector would
(404 for another path, 415 for another encoding, 400 for a body that does not
decode), so the exporter under test must speak OTLP for a span to land.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def value_of(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Handler(BaseHTTPRequestHandler):
    out = None

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            return self.answer(404)
        if self.headers.get("Content-Type") != "application/x-protobuf":
            return self.answer(415)
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception:
            return self.answer(400)
        lines = []
        for rs in request.resource_spans:
            attrs = {a.key: value_of(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "service": attrs.get("service.name"),
                        "name": s.name,
                        "kind": s.kind,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": {a.key: value_of(a.value) for a in s.attributes},
                    }))
        with open(Handler.out, "a") as f:
            for line in lines:
                f.write(line + "\n")
        self.answer(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    Handler.out = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
