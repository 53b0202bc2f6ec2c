"""Rewrites CUDA sources for the emulated runtime (cuda_runtime.h here), for the emulate.sh scripts:
  python3 tests/cuda/emu/rewrite.py OUT_DIR SRC[:DST[:LEAST]] ...
Each `kernel<<<grid, block[, smem[, stream]]>>>(args` becomes
`emu::launch("kernel", kernel, grid, block, smem, stream, args` (the name without template
arguments; `kern`, a local pointer to conv_gemm_kernel, is named as that), each
`extern __shared__ __align__(16) unsigned char NAME[];` a pointer to the launch's dynamic shared
memory, and `#include "gemm_primitives.cuh"` the emulated wrappers (gemm_family/emu). DST
(default: SRC's name, .cu -> .cc) is written into OUT_DIR; LEAST: the launches SRC must have.
"""
import pathlib
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.*?)>>>\(", re.S)
DYNAMIC_SMEM = re.compile(r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];")


def split_top(s):
  """Splits a launch configuration at its top-level commas."""
  parts, depth, cur = [], 0, ""
  for ch in s:
    depth += ch in "(<[{"
    depth -= ch in ")>]}"
    if ch == "," and depth == 0:
      parts.append(cur.strip())
      cur = ""
    else:
      cur += ch
  return parts + [cur.strip()]


def launch(m):
  kernel, cfg = m.group(1), split_top(m.group(2))
  cfg += ["0", "nullptr"][len(cfg) - 2:]
  name = "conv_gemm_kernel" if kernel == "kern" else re.sub(r"<.*", "", kernel, flags=re.S)
  return f'emu::launch("{name}", {kernel}, {", ".join(cfg)}, '


def rewrite(text):
  text, n = LAUNCH.subn(launch, text)
  text = DYNAMIC_SMEM.sub(r"unsigned char* const \1 = emu::dynamic_smem;", text)
  text = text.replace('#include "gemm_primitives.cuh"', '#include "gemm_primitives.h"')
  return text, n


def main(out, specs):
  for spec in specs:
    src, dst, least = (spec.split(":") + ["", ""])[:3]
    dst = dst or re.sub(r"\.cu$", ".cc", pathlib.Path(src).name)
    text, n = rewrite(pathlib.Path(src).read_text())
    assert n >= int(least or 0), f"{src}: {n} launches rewritten, expected at least {least}"
    (pathlib.Path(out) / dst).write_text(text)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
