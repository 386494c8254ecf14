"""``python -m anarchon`` is the ``anarchon`` command."""

import sys

from .cli import main

sys.exit(main())
