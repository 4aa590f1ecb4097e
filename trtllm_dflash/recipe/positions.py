"""Where each field of a recipe was written, so every recipe error names it at the start of its
line: `FILE:LINE:COLUMN: field: ...` (1-based, the key's position as PyYAML's composer marks it),
`FILE (--set KEY=VALUE): field: ...` when an override set it, and for a field the file leaves to
its default the nearest section that is written: `FILE:LINE:COLUMN (in SECTION, not set): field: ...`."""

from __future__ import annotations

import yaml


class Positions:
    """The positions of one recipe text's keys, and the overrides applied over it."""

    def __init__(self, file: str, text: str | None = None, overrides: list[str] | None = None):
        self.file = file
        self.marks: dict[str, tuple[int, int, bool]] = {}  # dotted field -> (line, column, value is a mapping)
        try:
            node = yaml.compose(text) if text else None
        except yaml.YAMLError:
            node = None
        self._walk(node, ())
        self.overrides = {item.split("=", 1)[0].strip(): item for item in overrides or [] if "=" in item}

    def _walk(self, node, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            children = [(str(k.value), k, v) for k, v in node.value]
        elif isinstance(node, yaml.SequenceNode):
            children = [(str(i), v, v) for i, v in enumerate(node.value)]
        else:
            return
        for name, at, value in children:
            key = (*prefix, name)
            self.marks[".".join(key)] = (at.start_mark.line + 1, at.start_mark.column + 1,
                                         isinstance(value, yaml.MappingNode))
            self._walk(value, key)

    def at(self, field: str) -> str:
        """`field` after where it was written, for the start of an error line."""
        for key, item in self.overrides.items():
            if field == key or field.startswith(key + ".") or key.startswith(field + "."):
                return f"{self.file} (--set {item}): {field}"
        parts = field.split(".")
        for n in range(len(parts), 0, -1):
            section = ".".join(parts[:n])
            mark = self.marks.get(section)
            if mark:
                line, column, mapping = mark
                unset = f" (in {section}, not set)" if n < len(parts) and mapping else ""
                return f"{self.file}:{line}:{column}{unset}: {field}"
        return f"{self.file}:1:1 (not set): {field}"
