"""What tests/e2e/test_zygote.py forks: says what it was given, then ends as `argv[1]` says
(an exit code, `raise`, `wait` for a signal, or `linger`: exit 0 slowly); an atexit handler says
it ran."""

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
if sys.argv[1] == "linger":  # an exit that takes a while, as a big interpreter's can
    atexit.register(time.sleep, 3)
    atexit.register(print, "exiting", flush=True)  # first: atexit runs the last registered first
    sys.exit(0)
sys.exit(int(sys.argv[1]))
