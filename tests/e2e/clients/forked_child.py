"""What tests/e2e/test_zygote.py forks: says what it was given, then ends as `argv[1]` says
(an exit code, `raise` or `wait` for a signal); an atexit handler says it ran."""

import atexit
import json
import os
import sys
import time

print(
    json.dumps(
        {"argv": sys.argv[1:], "mark": os.environ.get("ZYGOTE_TEST_MARK"), "ppid": os.getppid()}
    ),
    flush=True,
)
atexit.register(lambda: print("atexit ran", flush=True))
if sys.argv[1] == "raise":
    raise RuntimeError("a crash in a forked child")
if sys.argv[1] == "wait":
    time.sleep(120)
sys.exit(int(sys.argv[1]))
