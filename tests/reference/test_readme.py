"""The Python example in trtllm_dflash/reference/README.md runs as written."""

import re
from pathlib import Path

import trtllm_dflash.reference


def test_readme_example_runs(capsys):
    readme = Path(trtllm_dflash.reference.__file__).with_name("README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "tau=" in out and "length" in out
