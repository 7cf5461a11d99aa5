#!/usr/bin/env python3
"""Build, then check model_new.ModelNew against model.Model on freshly drawn random inputs.

Usage: python tools/verify.py [--json]
"""

import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _client import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("verify"))
