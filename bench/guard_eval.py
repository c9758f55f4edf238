#!/usr/bin/env python
"""Guard evaluation benchmark (same as ``python -m tripwire bench``); see bench/README.md.

    python bench/guard_eval.py                 # all workloads, 15 repeats, with torch if importable
    python bench/guard_eval.py --quick -w W2   # a smoke run of one workload
    python bench/guard_eval.py --no-torch --json out.json
"""

import sys

from tripwire.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
