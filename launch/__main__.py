"""``python -m launch`` is the ``psrec`` command."""

import sys

from launch.cli import main

sys.exit(main())
