"""GPU tests: everything here needs CUDA and is skipped (with the reason) without it.

Every module here sets `pytestmark = pytest.mark.gpu` (tests/conftest.py skips that marker
without CUDA). The KV-injection problem generator lives beside the CPU kernel
tests (tests/plugins/kv_inject_cases.py) and is imported from there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

