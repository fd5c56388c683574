from par3d.cli import main

raise SystemExit(main())
