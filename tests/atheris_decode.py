"""atheris harness: coverage-guided fuzzing of systems.ps.protocol.decode. Any exception other than
ProtocolError is a crash (atheris exits non-zero and prints the input). Run:

    python tests/atheris_decode.py -runs=20000
"""
from __future__ import annotations

import sys

import atheris
import msgpack  # (imported first: instrumenting numpy/msgpack would take minutes)
import numpy  # noqa: F401  (not instrumented either)

with atheris.instrument_imports(include=["psbench.systems.ps.protocol"]):
    from psbench.systems.ps import protocol

TOKEN = "t"


OPS = sorted(protocol.ALL_OPS) + ["exec", ""]
DTYPES = ["float32", "float64", "int8", ""]


def structured_header(fdp: "atheris.FuzzedDataProvider", n: int) -> bytes:
    """A msgpack map built from the input (msgpack is C code: raw bytes alone would not get the
    fuzzer past it to the validation logic)."""
    header = {}
    for name in ("op", "worker", "step", "version", "keys", "dtypes", "shapes", "token", "rid"):
        if not fdp.ConsumeBool():
            continue
        if name == "op":
            header[name] = fdp.PickValueInList(OPS)
        elif name in ("keys",):
            header[name] = [fdp.ConsumeIntInRange(-2, 8) for _ in range(fdp.ConsumeIntInRange(0, n + 1))]
        elif name == "dtypes":
            header[name] = [fdp.PickValueInList(DTYPES) for _ in range(fdp.ConsumeIntInRange(0, n + 1))]
        elif name == "shapes":
            header[name] = [[fdp.ConsumeIntInRange(-1, 16) for _ in range(fdp.ConsumeIntInRange(0, 3))]
                            for _ in range(fdp.ConsumeIntInRange(0, n + 1))]
        elif name == "token":
            header[name] = fdp.PickValueInList([TOKEN, "x", 1])
        else:
            header[name] = fdp.ConsumeIntInRange(-3, 3) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(3)
    return msgpack.packb(header, use_bin_type=True)


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    n = fdp.ConsumeIntInRange(1, 4)
    structured = fdp.ConsumeBool()
    head = structured_header(fdp, n - 1) if structured else None
    frames = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 256)) for _ in range(n - 1)]
    frames.insert(0, head if structured else fdp.ConsumeBytes(fdp.remaining_bytes()))
    for token in (None, TOKEN):
        try:
            msg = protocol.decode(frames, token=token, max_bytes=1 << 16)
        except protocol.ProtocolError:
            continue
        # what decode accepts is consistent: one array per key, each matching its declared shape
        assert len(msg.keys) == len(msg.arrays) == len(frames) - 1
        for a in msg.arrays:
            assert a.dtype.name in protocol.ALLOWED_DTYPES


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
