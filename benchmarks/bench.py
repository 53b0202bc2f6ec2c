"""Thin wrapper: the benchmark lives in the package as `jaxdnn.bench` (`jaxdnn-bench`).

    python benchmarks/bench.py --dtypes fp32 --csv out.csv     # = python -m jaxdnn.bench ...

Every flag of jaxdnn.bench works here (python -m jaxdnn.bench --help).
"""

import sys

from jaxdnn.bench import main

if __name__ == "__main__":
  sys.exit(main())
