"""The policy's loop tests run the reference decoder over tiny models: one torch thread, as
tests/reference/ (reference_helpers.one_thread)."""

from reference_helpers import one_thread as _one_thread  # noqa: F401  (autouse)
