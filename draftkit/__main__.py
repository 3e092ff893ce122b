from draftkit.cli import main

raise SystemExit(main())
