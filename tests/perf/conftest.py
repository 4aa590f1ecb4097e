"""Kernel fixtures (tests/helpers/kernel_fixtures.py): TRITON_INTERPRET=1 is set on import, before
any test module here imports the kernel."""

from kernel_fixtures import device, kernel  # noqa: F401
