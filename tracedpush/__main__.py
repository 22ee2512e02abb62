from tracedpush.cli import main

raise SystemExit(main())
