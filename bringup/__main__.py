"""``python -m bringup``: see bringup.cli."""

import sys

from bringup.cli import main

sys.exit(main())
