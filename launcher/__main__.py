"""`python -m launcher`: what `make run` runs (launcher/__init__.py says what it does)."""

import sys

from launcher import main

sys.exit(main())
