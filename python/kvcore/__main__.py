"""`python -m kvcore` runs the kvcore command line (see kvcore.cli)."""

from kvcore.cli import main

raise SystemExit(main())
