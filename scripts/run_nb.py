"""Execute notebooks in place the way `nbdev_test` does (honouring `#| eval: false` and skip flags), keeping outputs.

Outputs are part of what a reader sees (README, docs site); this fills them without Quarto or a Jupyter server.
Usage: python scripts/run_nb.py nbs/index.ipynb [more.ipynb ...] [--flags "slow model"]
"""
import sys, argparse, os
from pathlib import Path
from execnb.nbio import read_nb, write_nb
from execnb.shell import CaptureShell
from nbdev.config import get_config

def run(path, flags=()):
    "Execute `path` in place with nbdev's test semantics; cells flagged with a tst_flag not in `flags` are skipped."
    nb = read_nb(path)
    skip = set(get_config().tst_flags.split()) - set(flags)
    def preproc(cell):
        "True for cells nbdev_test would not run: markdown, the export call, `eval: false`, skipped flags."
        if cell.cell_type != 'code' or 'nbdev_export' + '(' in cell.source: return True
        direc = [l.strip()[2:].strip() for l in cell.source.splitlines() if l.strip().startswith('#|')]
        return any(d.replace(' ', '') == 'eval:false' or d.split(':')[0].split()[0] in skip for d in direc if d)
    cwd = os.getcwd(); os.chdir(Path(path).parent)
    try:
        shell = CaptureShell()
        shell.run_all(nb, exc_stop=True, preproc=preproc)
    finally: os.chdir(cwd)
    write_nb(nb, path)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('paths', nargs='+'); ap.add_argument('--flags', default='')
    a = ap.parse_args()
    for p in a.paths: run(p, a.flags.split()); print('ran', p)
