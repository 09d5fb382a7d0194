"""``python -m neptune_fusion.bench``."""

import sys

from . import main

sys.exit(main())
