"""Make the shared problem generator (``paged_problems``) importable from the kernel tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
