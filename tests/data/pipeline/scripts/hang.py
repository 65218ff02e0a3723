"""Start a process tree that would outlive a careless runner, print ``READY <pids>``, hang.

* a child that ignores SIGTERM (only SIGKILL stops it);
* a child that calls setsid(), leaving the stage's process group (only the run id finds it).
"""

import signal
import subprocess
import sys
import time

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
ESCAPE = "import os, time; os.setsid(); time.sleep(600)"

children = [subprocess.Popen([sys.executable, "-c", code]) for code in (IGNORE_TERM, ESCAPE)]
time.sleep(1)
print("READY " + " ".join(str(p.pid) for p in children), flush=True)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
