"""`python -m app.runtime.cli`: the `jobq` command."""

import sys

from app.runtime.cli import main

sys.exit(main())
