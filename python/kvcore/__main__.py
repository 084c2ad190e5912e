"""`python -m kvcore` runs the kvcore command line (see kvcore.cli)."""

from kvcore.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
