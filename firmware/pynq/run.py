#!/usr/bin/env python3
"""Bundle entry point (the manifest's runner.entry): the FPGA smoke test, see smoke.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from smoke import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
