from conveyor.cli import main

raise SystemExit(main())
