"""Typed reads from one config.json dict: each field checked as it is read, each problem one
`UserError` line naming the file and the field. The target's, the drafter's (config.py) and the
RoPE's (rope.py) readers share it."""

from __future__ import annotations

import math
from typing import Any

from trtllm_dflash.errors import UserError


class Fields:
    """Typed reads from one config dict; errors name `where` (e.g. 'target config.json')."""

    def __init__(self, raw: dict[str, Any], where: str):
        self.raw, self.where = raw, where

    def fail(self, msg: str) -> UserError:
        return UserError(f"{self.where}: {msg}")

    def missing(self, key: str, default: Any) -> Any:
        """The value of an absent (or null) field: `default`, or an error when it is required (`...`)."""
        if default is ...:
            raise self.fail(f"missing required field '{key}'")
        return default

    def int(self, key: str, default: Any = ..., lo: int = 1, src: dict | None = None) -> int:
        v = (self.raw if src is None else src).get(key)
        if v is None:
            return self.missing(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.fail(f"'{key}' is {v!r}, expected an integer >= {lo}")
        return v

    def float(self, key: str, default: Any = ..., src: dict | None = None) -> float:
        v = (self.raw if src is None else src).get(key)
        if v is None:
            return self.missing(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise self.fail(f"'{key}' is {v!r}, expected a positive number")
        return float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.raw.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(f"'{key}' is {v!r}, expected true or false")
        return v
