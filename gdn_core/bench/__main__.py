"""`python -m gdn_core.bench <name> [options]`: see gdn_core.bench."""

from . import main

raise SystemExit(main())
