"""Print the environment as one line: ``ENV {json}`` (the pipeline's env allowlist tests read it)."""

import json
import os

print("ENV " + json.dumps(dict(os.environ), sort_keys=True), flush=True)
