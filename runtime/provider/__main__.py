"""``python -m runtime.provider``: the same as ``agentcell provider``."""

import sys

from runtime.provider.cli import cli_main

sys.exit(cli_main())
