"""``python -m refsight.cli``: the same command as the ``refsight`` console script."""

import sys

from . import main

sys.exit(main())
