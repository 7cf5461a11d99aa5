#!/usr/bin/env python3
"""Build the kernels in kernels/ (only what changed is rebuilt).

Usage: python tools/compile.py [--json]
"""

import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _client import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("compile"))
