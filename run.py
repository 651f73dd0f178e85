#!/usr/bin/env python3
"""Run the AG-UI adapter: ``python run.py [--help]``.

Without a configured kernel URL it starts ``iac-code a2a`` when iac-code is installed,
and the embedded scripted kernel otherwise, so it works out of the box.
"""

import sys

from agui_adapter.cli import main

if __name__ == "__main__":
    sys.exit(main())
