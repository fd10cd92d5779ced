"""``python -m nodekit.launcher <training argv>``: the image's entrypoint."""

from nodekit.launcher.main import main

raise SystemExit(main())
