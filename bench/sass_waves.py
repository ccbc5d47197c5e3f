"""Global-load round trips of a compiled kernel, read from its SASS (no GPU needed).

ptxas schedules each global load near its first use, not where the PTX issues it: a load
first used after a reduction of earlier loads is issued only once that reduction is done,
so a kernel meant to read its inputs in one round trip may take two or three (seen in the
rejection finalize, 2026-12-05). This module disassembles a cubin with Triton's bundled
nvdisasm and walks the code in layout order (branches are not followed: a straight-line
estimate) counting *waves*: a wave is a run of LDG instructions issued before any of them
is used; the first instruction that reads a register an outstanding LDG writes waits for
it (a scoreboard wait), and the next LDG after that starts a new wave.

    from bench.sass_waves import load_waves
    load_waves(compiled.asm["cubin"])   # {'ldg': 21, 'waves': 3, 'waves_after_wait': 2, 'bar': 8}

'waves_after_wait' counts from griddepcontrol.wait (SASS ACQBULK) on, the round trips of a
kernel launched with programmatic dependent launch once its producer is done; 'bar' the
BAR.SYNC barriers (exchanges across warps).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_REG = re.compile(r"\bR(\d+)(\.64|\.128)?\b")
_PRED = re.compile(r"!?U?P(T|\d+)$")
_STORE_LIKE = ("ST", "RED", "ATOM", "BAR", "BRA", "EXIT", "CALL", "RET", "BSYNC", "BSSY", "WARPSYNC")


def sass_of(cubin: bytes) -> str:
    """The SASS text of a cubin (nvdisasm -c, Triton's bundled copy)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([os.path.join(_BIN, "nvdisasm"), "-c", path], capture_output=True, text=True,
                              check=True).stdout


def _regs(text: str) -> set[int]:
    """Registers named in an operand text (R4.64: R4 and R5)."""
    out = set()
    for m in _REG.finditer(text):
        n = {".64": 2, ".128": 4}.get(m.group(2) or "", 1)
        out.update(range(int(m.group(1)), int(m.group(1)) + n))
    return out


def _load_width(opcode: str) -> int:
    return 4 if ".128" in opcode else 2 if ".64" in opcode else 1


def load_waves(cubin_or_sass) -> dict:
    """{'ldg', 'waves', 'waves_after_wait', 'bar'} of a cubin (bytes) or SASS text (module doc)."""
    sass = sass_of(cubin_or_sass) if isinstance(cubin_or_sass, bytes) else cubin_or_sass
    outstanding: set[int] = set()
    waited = True
    ldg = waves = bar = 0
    waves_at_wait = None
    for m in _INSTR.finditer(sass):
        opcode, operands = m.group(2), m.group(3)
        if opcode.startswith("ACQBULK") and waves_at_wait is None:
            waves_at_wait = waves
            waited = True                  # loads after the wait start a new wave
        if opcode.startswith("BAR"):
            bar += 1
        parts = [p.strip() for p in operands.split(",")]
        if opcode.startswith(_STORE_LIKE) or len(parts) == 1:
            reads = _regs(operands)
            dest = set()
        else:
            # the destination: the first operand, or the register after a predicate output
            # (SHFL.BFLY PT, R28, R31, ...: R28 is written)
            d = 1 if _PRED.match(parts[0]) and _REG.match(parts[1]) else 0
            dest = _regs(parts[d])
            reads = _regs(", ".join(parts[d + 1:]))
        if reads & outstanding:
            outstanding.clear()
            waited = True
        if opcode.startswith("LDG"):
            ldg += 1
            if waited:
                waves += 1
                waited = False
            if dest:
                outstanding.update(range(min(dest), min(dest) + _load_width(opcode)))
        else:
            outstanding -= dest            # overwritten before use: no longer a pending load's
    after_wait = None if waves_at_wait is None else waves - waves_at_wait
    return dict(ldg=ldg, waves=waves, waves_after_wait=after_wait, bar=bar)


if __name__ == "__main__":
    import sys
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            data = f.read()
        print(path, load_waves(data if path.endswith(".cubin") else data.decode()))
