"""`python -m relay`: the same as the `relay` console script."""

import sys

from relay.cli import main

sys.exit(main())
