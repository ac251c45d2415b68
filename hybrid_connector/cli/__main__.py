"""``python -m hybrid_connector.cli``: the same as the ``hybrid-connector`` command."""

import sys

from hybrid_connector.cli.entry import main

sys.exit(main())
