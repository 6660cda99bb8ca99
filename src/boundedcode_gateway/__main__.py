"""``python -m boundedcode_gateway`` runs the command line."""

import sys

from boundedcode_gateway.cli.main import main

sys.exit(main())
