"""``python -m refsight.cli``: the same command as the ``refsight`` console script."""

import sys

from . import main

if __name__ == "__main__":  # importing this module (a walk over every module, say) runs nothing
    sys.exit(main())
