"""Render README.md from nbs/index.ipynb without Quarto.

nbdev_readme needs Quarto, which cannot be installed on every machine; this does the same job with
nbdev's own notebook processors (directives stripped, hidden cells dropped) and nbconvert.
"""
import sys, pathlib, nbformat
from nbconvert import MarkdownExporter

DROP = {'hide', 'exporti', 'default_exp', 'export', 'exports'}  # cells a reader never sees
root = pathlib.Path(__file__).resolve().parents[1]

def render(src=root/'nbs'/'index.ipynb', dest=root/'README.md'):
    "Write `dest` from `src`: markdown cells as they are, code cells with their outputs, hidden cells dropped."
    nb = nbformat.read(src, as_version=4)
    cells = []
    for c in nb.cells:
        lines = c.source.splitlines()
        directives = {l[2:].strip().split(':')[0].split()[0] for l in lines if l.startswith('#|') and l[2:].strip()}
        if c.cell_type == 'code' and directives & DROP: continue
        c.source = '\n'.join(l for l in lines if not l.startswith('#|'))
        cells.append(c)
    nb.cells = cells
    body, _ = MarkdownExporter().from_notebook_node(nb)
    dest.write_text(body.strip() + '\n')
    return dest

if __name__ == '__main__': print(render())
