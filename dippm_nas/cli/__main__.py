"""``python -m dippm_nas.cli``: the same as the ``dippm-nas`` command."""

import sys

from dippm_nas.cli import main

if __name__ == "__main__":
    sys.exit(main())
