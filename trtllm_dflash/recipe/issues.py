"""What a recipe rule reports: an error (refused) or a warning (a note), naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Issue:
    level: Literal["error", "warning"]
    field: str
    message: str


class Issues(list):
    """The issues of one group of rules, added by `err` and `warn`."""

    def err(self, field: str, msg: str) -> None:
        self.append(Issue("error", field, msg))

    def warn(self, field: str, msg: str) -> None:
        self.append(Issue("warning", field, msg))
