"""The docs pipeline on a fixture nbdev project: every way a notebook defines a class member renders right.

A tiny project (settings.ini, one notebook, `nbdev_export`) is written to a temporary folder. Its notebook defines
members both ways the package has used: fastcore's `@patch`, `@patch(as_prop=True)`, `@patch(cls_method=True)` with
`show_doc(Class.member)` cells, and plain functions assigned after the class (`Class.member = member`, which nbdev
documents as module-level functions); plus a dataclass with parameter comments and a function without a docstring.
The pipeline (`scripts/docs/nbpages.py`, then mkdocs-jupyter's converter) must show each as `Class.member` once,
with its kind, docstring, parameter table and [source] line, and never a repr or "Call self as a function.".
"""
import re, subprocess, sys, textwrap
from configparser import ConfigParser
from pathlib import Path

import nbformat, pytest

ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    ('markdown', '# Fixture\n\n> Every way of defining a member'),
    ('code', '#| default_exp core'),
    ('code', '#| export\nfrom dataclasses import dataclass\nfrom fastcore.basics import patch'),
    ('code', '''#| export
class Box:
    "A box of things."
    def __init__(self, n:int=3, # how many things
                 name:str='b'): # its label
        self.n, self.name = n, name'''),
    ('code', '''#| export
@patch
def grow(self:Box, k:int=1, # how many to add
        )->int: # the new count
    "Add `k` things."
    self.n += k; return self.n'''),
    ('code', 'show_doc(Box.grow)'),
    ('code', '''#| export
@patch(as_prop=True)
def size(self:Box)->int:
    "The number of things."
    return self.n'''),
    ('code', 'show_doc(Box.size)'),
    ('code', '''#| export
@patch(cls_method=True)
def empty(cls:Box, name:str='e'): # the label
    "A box with nothing in it."
    return cls(0, name)'''),
    ('code', 'show_doc(Box.empty)'),
    ('code', '''#| export
def nodoc(x, y=2): return x + y'''),
    ('code', '''#| export
@dataclass
class Spec:
    "A spec."
    a:int # the first
    b:str='x' # the second'''),
    ('code', '''#| export
def old(self, m:int=2): # a multiplier
    "Old-style method."
    return self.n * m

@property
def oldprop(self):
    "Old-style property."
    return 2

@classmethod
def oldcm(cls):
    "Old-style classmethod."
    return cls()

Box.old, Box.oldprop, Box.oldcm = old, oldprop, oldcm'''),
    ('code', 'show_doc(Box.oldprop)'),   # explicitly documented too: must still appear once
    ('code', '''#| export
class Tray:
    "Members written in the class body, with no `show_doc` of their own."
    def put(self, x:int, # the thing to put
            ): "Put `x` on the tray."
    @property
    def count(self)->int: "How many things are on it."
    def _hidden(self): "Not public."'''),
]

@pytest.fixture(scope='module')
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp('fixture')
    cfg = ConfigParser(); cfg.read(ROOT/'settings.ini')
    d = cfg['DEFAULT']
    for k, v in dict(repo='fxlib', lib_name='fxlib', lib_path='fxlib', git_url='https://github.com/example/fxlib', title='fxlib',
                     user='example', requirements='', dev_requirements='', model_requirements='', linux_requirements='',
                     console_scripts='', readme_nb='').items(): d[k] = v
    with open(root/'settings.ini', 'w') as f: cfg.write(f)
    (root/'nbs').mkdir()
    nb = nbformat.v4.new_notebook(metadata={'kernelspec': {'name': 'python3', 'display_name': 'python3', 'language': 'python'}})
    nb.cells = [nbformat.v4.new_markdown_cell(s) if k == 'markdown' else nbformat.v4.new_code_cell(s) for k, s in CELLS]
    nbformat.write(nb, root/'nbs'/'00_core.ipynb')
    r = subprocess.run([str(Path(sys.executable).parent/'nbdev_export')], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (root/'fxlib'/'core.py').exists()
    return root

@pytest.fixture(scope='module')
def rendered(project, tmp_path_factory):
    "(markdown of the processed page, its HTML from mkdocs-jupyter)."
    import nbdev.showdoc
    saved = nbdev.showdoc.BasicMarkdownRenderer
    sys.path.insert(0, str(ROOT/'scripts'/'docs')); sys.path.insert(0, str(project))
    try:
        import nbpages
        out = tmp_path_factory.mktemp('pages')
        pages = nbpages.build_pages(project, out, log=lambda *a: None)
        assert [p.name for p in pages] == ['core']
        md = '\n\n'.join(c.source for c in pages[0].nb.cells if c.cell_type == 'markdown')
        from mkdocs_jupyter.convert import nb2html
        html = nb2html(str(out/'core.ipynb'))
        return md, html
    finally:
        nbdev.showdoc.BasicMarkdownRenderer = saved
        sys.path.remove(str(project))

def _entries(html):
    return re.findall(r'<h3 class="vq-doc" id="([^"]+)"><code>([^<]+)</code>(?: <span class="vq-kind">(\w+)</span>)?', html)

def test_members_render_as_members_once(rendered):
    _, html = rendered
    entries = _entries(html)
    names = [n for _, n, _ in entries]
    want = {'Box': '', 'Box.grow': '', 'Box.size': 'property', 'Box.empty': 'classmethod', 'nodoc': '', 'Spec': 'dataclass',
            'Box.old': '', 'Box.oldprop': 'property', 'Box.oldcm': 'classmethod'}
    want.update({'Tray': ''})
    assert sorted(names) == sorted(want), f'entries: {names}'
    assert {n: k for _, n, k in entries} == want
    assert all(i == n.lower() for i, n, _ in entries), 'anchors are nbdev\'s (the name, lower-cased)'

def test_no_repr_and_no_borrowed_docstring(rendered):
    _, html = rendered
    for bad in ('object at 0x', 'Call self as a function', '<property', '<classmethod', '<function', 'cls:'):
        assert bad not in html, f'{bad!r} on the page'

def _entry(md, name):
    m = re.search(rf'<h3 class="vq-doc" id="{re.escape(name.lower())}">(.*?)(?=<h3 class="vq-doc"|\Z)', md, re.S)
    assert m, f'no entry {name}'
    return m.group(1)

def test_signatures_docstrings_and_parameter_tables(rendered):
    md, _ = rendered
    e = _entry(md, 'Box.grow')
    assert 'Box.grow(k:int=1) -> int' in e and 'Add `k` things' in e or 'Add [`k`]' in e
    assert re.search(r'\| <code>k</code> \| int \| <code>1</code> \| how many to add \|', e)
    assert re.search(r'\| \*\*Returns\*\* \| int \| \| the new count \|', e)
    e = _entry(md, 'Box.empty')
    assert 'Box.empty(name:str=\'e\')' in e and 'A box with nothing in it.' in e and '| <code>name</code> | str |' in e
    e = _entry(md, 'Box.size')
    assert 'Box.size: int' in e and 'The number of things.' in e
    e = _entry(md, 'Spec')
    assert 'class Spec(a:int, b:str=\'x\')' in e and 'A spec.' in e and 'the second' in e
    e = _entry(md, 'nodoc')
    assert 'nodoc(x, y=2)' in e and not re.search(r'```\s*\n\s*\S', e.split('```', 2)[-1]), 'a docstring appeared for nodoc'
    e = _entry(md, 'Box.old')
    assert 'Box.old(m:int=2)' in e and 'Old-style method.' in e and 'a multiplier' in e
    e = _entry(md, 'Box')
    assert 'class Box(n:int=3, name:str=\'b\')' in e and 'how many things' in e
    for m in ('grow', 'size', 'empty', 'old', 'oldprop', 'oldcm'): assert f'#box.{m}"' in e, f'Box lists no member {m}'

def test_source_links_go_to_the_line(rendered, project):
    md, _ = rendered
    links = re.findall(r'<h3 class="vq-doc" id="([^"]+)">.*?href="https://github.com/example/fxlib/blob/main/(fxlib/core.py)#L(\d+)"', md)
    assert len(links) == 10
    src = (project/'fxlib'/'core.py').read_text().splitlines()
    for anchor, path, line in links:
        short = anchor.rsplit('.', 1)[-1]
        near = '\n'.join(src[int(line) - 1:int(line) + 2])
        assert re.search(rf'(def|class) {short}\b', near, re.I), f'{anchor}: line {line} is {near!r}'

def test_class_body_members_get_their_own_entries(rendered):
    "A member the class entry lists but nothing else documents gets an entry (h4) under its class: its link resolves."
    _, html = rendered
    subs = re.findall(r'<h4 class="vq-doc" id="([^"]+)"><code>([^<]+)</code>(?: <span class="vq-kind">(\w+)</span>)?', html)
    assert [(n, k) for _, n, k in subs] == [('Tray.put', ''), ('Tray.count', 'property')], subs
    ids = set(re.findall(r'id="([^"]+)"', html))
    for href in re.findall(r'href="#?(?:core\.html)?#([^"]+)"', html):
        if href.startswith(('box.', 'tray.')): assert href in ids, f'member link #{href} has no entry'
    put = html[html.index('id="tray.put"'):html.index('id="tray.count"')]
    assert 'Put' in put and 'the thing to put' in put, 'Tray.put lacks its docstring or parameter table'
    assert 'tray._hidden' not in html
