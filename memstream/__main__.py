"""`python -m memstream`."""

import sys

from memstream.cli.commands import main

sys.exit(main())
