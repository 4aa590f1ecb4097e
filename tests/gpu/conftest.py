"""GPU tests: everything here needs CUDA and is skipped (with the reason) without it.

Every module here sets `pytestmark = pytest.mark.gpu` (tests/conftest.py skips that marker
without CUDA). The KV-injection problem generator lives beside the CPU kernel
tests (tests/helpers/kv_inject_cases.py).
"""
