"""Finds global loads that a thread waits for one at a time: an LDG whose result is read before the
next LDG (within a few dozen instructions) is issued, so the two latencies add up instead of
overlapping (session 21: the wgmma forward's bias loads, each unpacked inside its own branch: 16
L2 round trips per CTA). Prints, per kernel, the count of such loads and the first few. The
counts include cold paths (scalar fallbacks of the epilogue, one load per loop iteration), so
compare two builds of one kernel rather than read a count alone: the session-21 fix took the
128x128 bf16 wgmma forward from 68 to 52, the 16 bias loads.

    cuobjdump -sass OBJ > obj.sass; python3 scripts/sass-serial-loads.py obj.sass [--min 4]

cuobjdump: the PyPI wheel nvidia-cuda-cuobjdump (bin/cuobjdump) runs on a host without a GPU.
"""

import argparse
import re
import sys

INSN = re.compile(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
REG = re.compile(r"\bR(\d+)\b")


def kernels(lines):
  name, body = None, []
  for line in lines:
    m = re.search(r"Function : (\S+)", line)
    if m:
      if name:
        yield name, body
      name, body = m.group(1), []
    else:
      m = INSN.search(line)
      if m and name:
        body.append((m.group(1), m.group(2)))
  if name:
    yield name, body


def _dst(text):
  """The destination register of an instruction (after an optional predicate), or None."""
  parts = text.split()
  k = 1 if parts and parts[0].startswith("@") else 0
  if len(parts) <= k + 1:
    return None
  m = REG.search(parts[k + 1])
  return m.group(0) if m else None


def _reads(text, reg):
  """Whether the instruction reads reg (any operand after the destination)."""
  parts = text.split(None, 2 if text.startswith("@") else 1)
  args = parts[-1] if len(parts) > 1 else ""
  return any(re.search(rf"\b{reg}\b", a) for a in args.split(",")[1:])


def serial_loads(body, window=60):
  """(address, text) of each global load whose result is read before the next global load is
  issued, where that next load follows within `window` instructions: the thread waits out the
  first load's latency before it issues the second."""
  is_load = lambda t: "LDG" in t and "LDGSTS" not in t and "LDGDEPBAR" not in t
  found = []
  for i, (addr, text) in enumerate(body):
    if not is_load(text):
      continue
    reg = _dst(text)
    if reg is None:
      continue
    for later_addr, later in body[i + 1:i + window]:
      if is_load(later):
        break  # the next load issued first: no wait in between
      if "BAR.SYNC" in later or later.startswith("EXIT"):
        break
      if _reads(later, reg):
        if any(is_load(t) for _, t in body[i + 1:i + window] if _ > later_addr):
          found.append((addr, text))
        break
  return found


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("sass")
  ap.add_argument("--min", type=int, default=4, help="report kernels with at least this many")
  a = ap.parse_args()
  with open(a.sass) as f:
    for name, body in kernels(f):
      hits = serial_loads(body)
      if len(hits) >= a.min:
        print(f"{len(hits):4d}  {name}")
        for addr, text in hits[:4]:
          print(f"        {addr}: {text}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
