"""``python -m laneflow_dev.imitation``."""

from laneflow_dev.imitation.cli import main

raise SystemExit(main())
