"""A child for tests/test_harness_zygote.py: says what it was given, then exits with the
status its first argument names (or sleeps, for `sleep`)."""

import json
import os
import sys
import time

print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "env": os.environ.get("ZYGOTE_TEST"), "sid": os.getsid(0),
                  "pid": os.getpid(), "name": __name__}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(120)
sys.exit(int(sys.argv[1]))
