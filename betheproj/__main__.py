"""``python -m betheproj ARGS``: the ``betheproj`` command line."""

import sys

from .cli import main

sys.exit(main())
