import sys

from . import cli_main

sys.exit(cli_main())
