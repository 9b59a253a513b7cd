"""``python -m psrec`` is the ``psrec`` command."""

import sys

from psrec.launch.cli.main import main

sys.exit(main())
