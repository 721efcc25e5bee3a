"""Every notebook under notebooks/ runs top to bottom against the installed package (code cells, in order)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb file"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, capsys):
    nb = json.loads(path.read_text())
    namespace: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        assert not any(line.lstrip().startswith(("%", "!")) for line in source.splitlines()), (
            f"{path.name} cell {i}: IPython magics/shell escapes are not allowed (plain Python only)")
        exec(compile(source, f"{path.name}[cell {i}]", "exec"), namespace)  # noqa: S102 - our own notebook
    assert capsys.readouterr().out, f"{path.name} printed nothing"
