"""How the benchmarks show a result already laid out as (header, rows of cells): a rich table on
the terminal, a Markdown table for the docs/ blocks they write."""

from __future__ import annotations


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


def print_table(title: str, head: list[str], body: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in head:
        t.add_column(col, justify="right")
    for r in body:
        t.add_row(*r)
    Console(width=140).print(t)
