"""``python -m neptune_fusion``: the same as the ``neptune-fusion`` command."""

from .cli import main

raise SystemExit(main())
