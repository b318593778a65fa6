#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/<target>/ from the repository's fixtures and the shapes the
proptest generators build (run from anywhere; rewrites the seed directories)."""
import json, os, struct, sys
import yaml  # PyYAML

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
C = os.path.join(HERE, "corpus")

def put(target, name, data):
    d = os.path.join(C, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def nla(kind, payload):
    b = struct.pack("=HH", 4 + len(payload), kind) + payload
    return b + b"\0" * (-len(b) % 4)

def msg(kind, cmd, attrs):
    return struct.pack("=IHHII", 16 + 4 + len(attrs), kind, 0, 7, 0) + bytes([0, cmd, 0, 0]) + attrs

def pfc(en, rx3=120, tx3=5):
    req = [0] * 8; ind = [0] * 8; req[3] = tx3; ind[3] = rx3
    return struct.pack("=BBBxHxx8Q8Q", 8, en, 0, 7, *req, *ind)

def apps(entries):
    return b"".join(nla(1, struct.pack("=BBH", s, p, proto)) for s, p, proto in entries)

def mlx5(en, entries, dcbx):
    ieee = nla(1, bytes(59)) + nla(7, bytes(64)) + nla(2, pfc(en)) + nla(10, bytes(44)) + nla(3, apps(entries))
    top = nla(1, b"ens1f0np0\0") + nla(13 | 0x8000, ieee) + nla(14, bytes([dcbx]))
    return msg(78, 21, top)

# DCB: replies like the probe's unit tests and mlx5 send, an error, and truncations.
put("dcb", "mlx5-pfc3-dscp", mlx5(0x08, [(5, 3, 26), (5, 3, 24)], 0x4))
put("dcb", "mlx5-pfc-off-pcp", mlx5(0, [], 0x4))
put("dcb", "pfc-only", msg(78, 21, nla(13 | 0x8000, nla(2, pfc(0xff)))))
put("dcb", "dcbx-only", msg(78, 21, nla(14, b"\x01")))
put("dcb", "error-eopnotsupp", struct.pack("=IHHII", 36, 2, 0, 7, 0) + struct.pack("=i", -95) + bytes(16))
put("dcb", "ack", struct.pack("=IHHII", 36, 2, 0, 7, 0) + bytes(20))
put("dcb", "short-pfc", msg(78, 21, nla(13 | 0x8000, nla(2, pfc(8)[:100]))))
put("dcb", "wrong-cmd", msg(78, 3, nla(14, b"\x01")))

# Versions: the first line a range, the rest versions (fixtures, examples, README forms).
for i, text in enumerate([
    ">=550.54.15, <560\n550.90.07\n560\n550.54.14\n550.100",
    ">=12.4\n12.4\n12.3.99\n12.10",
    "~=535\n535.161.08\n536\n534.999",
    "~=12.4\n12.4.1\n12.5\n12.4",
    "==550.54.15\n550.54.15.0\n550.54.15.1",
    "!=550.54.14, >550\n550.54.14\n550.0.1",
    "<= 560 , > 1\n1\n1.0.0.1\n560.0",
    "12.4\n12.4.0\n12.40",
    "=9999999999\n1",
    ">=1.2.3.4.5\n1.2.3.4",
    ",,\n1",
]):
    put("version_range", f"seed-{i:02}", text)

# Durations: policy fields of the fixtures and examples, and the grammar's corners.
for i, text in enumerate(["30s", "5m", "1h30m", "0", "10m", "3m", "1.5h", "100ms", "250us",
                          "1ns", "0s", "-5s", "1d", "2562047h47m16.854775807s", "1h1h1h", "s", ""]):
    put("duration", f"seed-{i:02}", text)

# Reports: the fixtures as the API server would store them (JSON), and two damaged copies.
def load(p):
    with open(os.path.join(ROOT, p)) as f:
        return yaml.safe_load(f)
healthy = load("operator/tests/fixtures/evaluate/healthy-h100-report.yaml")
broken = load("operator/tests/fixtures/evaluate/broken-h100-report.yaml")
put("report", "healthy-h100", json.dumps(healthy, default=str))
put("report", "broken-h100", json.dumps(broken, default=str))
no_driver = json.loads(json.dumps(healthy, default=str)); no_driver["status"].pop("driverVersion", None)
put("report", "healthy-no-driver", json.dumps(no_driver))
one_gpu = json.loads(json.dumps(healthy, default=str)); one_gpu["status"]["gpus"] = one_gpu["status"]["gpus"][:1]
put("report", "healthy-one-gpu", json.dumps(one_gpu))
put("report", "status-only", json.dumps({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
                                          "metadata": {"name": "n"}, "spec": {"nodeName": "n"}, "status": {}}))
