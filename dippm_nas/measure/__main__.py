"""``python -m dippm_nas.measure``: the harness without the rest of the CLI."""

import sys

from dippm_nas.cli import main

if __name__ == "__main__":
    sys.exit(main(["measure", *sys.argv[1:]]))
