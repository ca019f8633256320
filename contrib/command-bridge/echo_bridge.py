#!/usr/bin/env python3
"""An example command-bridge program: reads the request from the environment, answers on stdout.

Run the server with it:

    # "server": {"backend": "command_bridge", "command": ["python3", "echo_bridge.py"]}
    hetero-infer serve --config bridge.json

A real bridge would call another inference program here. This one echoes, and
for testing fails on the prompt FAIL (exit status 3), hangs on SLEEP and lists
the names in its environment on ENV.
"""

import os
import sys
import time

prompt = os.environ["HETERO_PROMPT"]
if prompt == "FAIL":
    print("asked to fail", file=sys.stderr)
    sys.exit(3)
if prompt == "SLEEP":
    time.sleep(60)
if prompt == "ENV":
    print(" ".join(sorted(os.environ)), end="")
    sys.exit(0)
max_tokens = os.environ["HETERO_MAX_TOKENS"]
temperature = os.environ["HETERO_TEMPERATURE"]
top_p = os.environ["HETERO_TOP_P"]
print(f"echo: {prompt} (max_tokens={max_tokens}, temperature={temperature}, top_p={top_p})", end="")
