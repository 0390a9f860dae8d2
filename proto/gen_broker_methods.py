#!/usr/bin/env python3
"""The Broker service's method table, generated from broker.proto's descriptor at build time.

    gen_broker_methods.py PROTOC PROTO_DIR PROTO DESCRIPTOR_PROTO_DIR OUT.inc

Asks protoc for the file's descriptor (--descriptor_set_out) and for that descriptor as text
(--decode against descriptor.proto), so what is read is protoc's own parse of the file, then
writes OUT.inc: one X-macro, IBVX_BROKER_METHODS(X), calling X(Name, Request, Response, mutating)
for each rpc of service Broker in declaration order (proto/broker_methods.h builds the table on
it). Each rpc must say what it is with protobuf's own method option:
    option idempotency_level = NO_SIDE_EFFECTS;   a read-only call
    option idempotency_level = IDEMPOTENT;        a mutating call (idempotent by its key)
An rpc without one, or two rpcs of one request type that disagree, fail the build here.
"""
import os
import re
import subprocess
import sys
import tempfile

TOKEN = re.compile(r'\s*(?:([A-Za-z_][A-Za-z0-9_]*)\s*:\s*("(?:[^"\\]|\\.)*"|[^\s{}]+)|([A-Za-z_][A-Za-z0-9_]*)\s*\{|(\}))')


def parse_text(text):
    """protobuf text format into nested lists of (field, value) pairs (values: str or list)."""
    stack = [[]]
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = TOKEN.match(text, pos)
        if m is None:
            sys.exit(f"gen_broker_methods: cannot read protoc's text at {text[pos:pos + 60]!r}")
        if m.group(1):
            value = m.group(2)
            stack[-1].append((m.group(1), value[1:-1] if value.startswith('"') else value))
        elif m.group(3):
            child = []
            stack[-1].append((m.group(3), child))
            stack.append(child)
        else:
            stack.pop()
        pos = m.end()
    return stack[0]


def fields(node, name):
    return [v for k, v in node if k == name]


def one(node, name, default=None):
    found = fields(node, name)
    return found[0] if found else default


def main(protoc, proto_dir, proto, descriptor_dir, out):
    with tempfile.TemporaryDirectory() as tmp:
        descriptor_set = os.path.join(tmp, "set.pb")
        subprocess.run([protoc, f"--proto_path={proto_dir}", f"--descriptor_set_out={descriptor_set}", proto],
                       check=True)
        with open(descriptor_set, "rb") as f:
            text = subprocess.run([protoc, f"--proto_path={descriptor_dir}",
                                   "--decode=google.protobuf.FileDescriptorSet", "google/protobuf/descriptor.proto"],
                                  stdin=f, check=True, capture_output=True).stdout.decode()
    files = fields(parse_text(text), "file")
    services = [s for f in files for s in fields(f, "service") if one(s, "name") == "Broker"]
    if len(services) != 1:
        sys.exit(f"gen_broker_methods: {proto} has no service Broker")
    rows, mutating_of_request, problems = [], {}, []
    for method in fields(services[0], "method"):
        name = one(method, "name")
        request = one(method, "input_type").rsplit(".", 1)[-1]
        response = one(method, "output_type").rsplit(".", 1)[-1]
        level = one(one(method, "options", []), "idempotency_level")
        if level not in ("NO_SIDE_EFFECTS", "IDEMPOTENT"):
            problems.append(f"rpc {name}: say whether it changes anything, with option idempotency_level = "
                            "NO_SIDE_EFFECTS (read-only) or IDEMPOTENT (mutating, idempotent by its key)")
            continue
        mutating = level == "IDEMPOTENT"
        if mutating_of_request.setdefault(request, mutating) != mutating:
            problems.append(f"rpc {name}: {request} is the request of a read-only and of a mutating rpc; "
                            "the client decides by the request type, so give one of them its own")
        rows.append((name, request, response, mutating))
    if problems:
        sys.exit("\n".join(f"{proto}: {p}" for p in problems))
    lines = [f"    X({n}, {q}, {r}, {'true' if m else 'false'})" for n, q, r, m in rows]
    requests = [f"    X({q}, {'true' if m else 'false'})" for q, m in mutating_of_request.items()]
    body = (f"// Generated from {proto} by proto/gen_broker_methods.py: do not edit (proto/broker_methods.h).\n"
            "// X(Name, Request, Response, mutating) for each rpc of service Broker, in declaration order.\n"
            "#define IBVX_BROKER_METHODS(X) \\\n" + " \\\n".join(lines) + "\n"
            "// X(Request, mutating) for each request type, once (two rpcs may share one).\n"
            "#define IBVX_BROKER_REQUESTS(X) \\\n" + " \\\n".join(requests) + "\n")
    # Rewritten only when it changes, so a comment in the .proto rebuilds nothing.
    if not os.path.exists(out) or open(out).read() != body:
        with open(out + ".tmp", "w") as f:
            f.write(body)
        os.replace(out + ".tmp", out)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
