"""`python -m service.cli …`: the `gdn-sweep` command, for hosts where the entry point is not installed."""

import sys

from service.cli.main import main

sys.exit(main())
