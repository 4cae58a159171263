"""Load test for a running edgellm (or any OpenAI-compatible) server on loopback; see
edgellm/server/loadgen.py for the options and the figures it reports.

    python scripts/bench/load_test.py --url http://127.0.0.1:8080 --clients 1 8 16 64 --requests 64
"""

from __future__ import annotations

import sys

from edgellm.server.loadgen import main

if __name__ == "__main__":
    sys.exit(main())
