import sys

if sys.argv[1:2] == ["doctor"]:
    from agent.doctor import main as doctor

    raise SystemExit(doctor(sys.argv[2:]))

from agent.main import main

raise SystemExit(main())
