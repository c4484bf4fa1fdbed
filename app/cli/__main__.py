"""``python -m app.cli ...``: the same as the ``ellm`` script."""
import sys

from app.cli import main

sys.exit(main())
