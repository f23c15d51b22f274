"""Render README.md from nbs/index.ipynb without Quarto.

nbdev_readme needs Quarto, which cannot be installed on every machine; this does the same job with nbconvert:
hidden and export cells dropped, `#|` directives stripped, code cells with their outputs. Cells marked
`#| exec_doc` are run now (in nbs/, as the docs build runs them), so the README shows what they compute from the
files of this checkout (the quality summary from `nbs/results/quality.json`). Links to other notebooks
(`11_quality.ipynb`) point into nbs/ from the README.
"""
import os, re, sys, pathlib, nbformat
from nbconvert import MarkdownExporter

DROP = {'hide', 'exporti', 'default_exp', 'export', 'exports'}  # cells a reader never sees
root = pathlib.Path(__file__).resolve().parents[1]

def _directives(lines):
    return {l[2:].strip().split(':')[0].split()[0]: l[2:].partition(':')[2].strip()
            for l in lines if l.startswith('#|') and l[2:].strip()}

def _run_exec_doc(nb, cwd):
    "Outputs of the `#| exec_doc` cells, computed now (one shell for the notebook, in `cwd`)."
    cells = [c for c in nb.cells if c.cell_type == 'code' and 'exec_doc' in _directives(c.source.splitlines())]
    if not cells: return
    from execnb.shell import CaptureShell
    from execnb.nbio import dict2nb
    sh, here = CaptureShell(), os.getcwd()
    os.chdir(cwd)
    try:
        for c in cells:
            tmp = dict2nb({'cells': [dict(c)], 'metadata': {}}).cells[0]
            sh.cell(tmp)
            if sh.exc: raise RuntimeError(f'an exec_doc cell of the README failed:\n{c.source}') from (sh.exc[1] if isinstance(sh.exc, tuple) else sh.exc)
            outs = []
            for o in tmp.get('outputs', []):
                o = dict(o)
                if 'data' in o: o['data'] = {k: ''.join(v) if isinstance(v, list) else v for k, v in o['data'].items()}
                if isinstance(o.get('text'), list): o['text'] = ''.join(o['text'])
                outs.append(nbformat.from_dict(o))
            c.outputs = outs
    finally: os.chdir(here)

def render(src=root/'nbs'/'index.ipynb', dest=root/'README.md'):
    "Write `dest` from `src`: markdown cells as they are, code cells with their outputs, hidden cells dropped."
    nb = nbformat.read(src, as_version=4)
    _run_exec_doc(nb, src.parent)
    cells = []
    for c in nb.cells:
        lines = c.source.splitlines()
        d = _directives(lines)
        if c.cell_type == 'code' and (set(d) & DROP or d.get('include') == 'false'): continue
        if c.cell_type == 'code' and d.get('echo') == 'false':   # only what it shows: its Markdown output as Markdown
            md = [o.data['text/markdown'] for o in c.get('outputs', []) if 'text/markdown' in o.get('data', {})]
            c = nbformat.v4.new_markdown_cell('\n\n'.join(md))
        else: c.source = '\n'.join(l for l in lines if not l.startswith('#|'))
        if c.cell_type == 'markdown':
            c.source = re.sub(r'\]\((?!\w+://)([^)\s]+\.ipynb)(#[^)\s]*)?\)', lambda m: f'](nbs/{m.group(1)}{m.group(2) or ""})', c.source)
        cells.append(c)
    nb.cells = cells
    exporter = MarkdownExporter()
    exporter.exclude_input_prompt = exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(nb)
    dest.write_text(body.strip() + '\n')
    return dest

if __name__ == '__main__': print(render())
