"""Notebooks -> the notebooks the site shows: nbdev's own processing, then what mkdocs-jupyter needs.

nbdev (`nbdev.processors.FilterDefaults`) does the nbdev part: the title cell becomes the page title, `#| hide`
and `#| export` cells go, `show_doc` cells are added after exported definitions, backticked names are linked.
nbdev's `exec_show_docs` (which runs the notebook's exported code in a kernel) is replaced by `render_docs`:

- `show_doc(...)` cells are rendered from the imported package with `showdoc.DocEntry` (one entry per symbol and
  page) and become Markdown cells, so their headings are part of the page outline; every member a class entry lists
  (methods, properties, class methods) that the page documents nowhere else gets its own entry under the class;
- `#| exec_doc` cells are run at build time in an execnb shell (cwd = the notebook's folder, the namespace of the
  notebook's module preloaded), so what they show is computed from the files of this checkout, not saved outputs.

What is left for the site: Quarto's `#| include/echo/output: false` and `#| fig-alt: TEXT` (the alt text of the
images a cell shows, one per image separated by " | "; an image output without one fails the build),
`#| docs_widget: NAME` (the cell's ipywidget
is replaced on the site by `assets/widgets/NAME.js`, a kernel-free version of it), links between notebooks
(`x.ipynb` -> `x.html`) and to the published site (made relative). Every other output is the one saved in
the notebook; mkdocs-jupyter turns the result into HTML.
"""
from __future__ import annotations

import ast, contextlib, copy, html, importlib, json, os, re, warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from showdoc import DocEntry, Sources, member_names, unwrap, use_renderer

WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json'
_re_dir = re.compile(r'^\s*#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')

def find_notebooks(nbs: Path) -> list[Path]:
    "Every notebook under `nbs`, in file-name order; names starting with `_` or `.` are skipped (as nbdev does)."
    res = [p for p in nbs.rglob('*.ipynb') if not any(s.startswith(('_', '.')) for s in p.relative_to(nbs).parts)]
    return sorted(res, key=lambda p: p.relative_to(nbs).as_posix())

def page_name(nb_rel: Path) -> str:
    "nbdev's page name of a notebook: `01_allocators.ipynb` -> `allocators` (`.html` on the site)."
    from nbdev.doclinks import _nbpath2html
    return _nbpath2html(Path(nb_rel)).with_suffix('').as_posix()

@dataclass
class Page:
    name: str            # 'allocators' -> allocators.html
    title: str
    source: Path         # the notebook under nbs/
    nb: dict             # processed notebook (nbformat v4 dict)
    widgets: set = field(default_factory=set)

class Context:
    "What every notebook's processing shares: the config, the imported package, the show_doc renderer."
    def __init__(self, root: Path):
        from nbdev.config import get_config
        get_config.cache_clear()
        self.root = Path(root).resolve()
        self.cfg = get_config(path=self.root)
        self.lib = self.cfg.lib_name
        self.nbs = Path(self.cfg.nbs_path)
        host, base = self.cfg.get('doc_host', ''), self.cfg.get('doc_baseurl', '')
        self.doc_prefix = (host.rstrip('/') + '/' + base.strip('/') + '/') if host else None
        self.pkg = importlib.import_module(self.lib)
        try: self.modidx = importlib.import_module(f'{self.lib}._modidx').d.get('syms', {})
        except Exception: self.modidx = {}
        self.mod_pages = {}
        for mod, syms in self.modidx.items():
            locs = [v[0] for v in syms.values() if isinstance(v, (list, tuple))]
            if locs: self.mod_pages[mod] = locs[0].split('#')[0]
        self.mod_pages.setdefault(self.lib, 'api.html')
        use_renderer(Sources(self.root, self.cfg.get('git_url', ''), self.cfg.get('branch', 'main')), self.page_of)

    def page_of(self, obj) -> str | None:
        "The page that documents `obj` (`cache.html`), from nbdev's module index."
        fn = obj if isinstance(obj, type) else unwrap(obj)
        return self.mod_pages.get(getattr(fn, '__module__', None))

    def namespace(self, default_exp: str | None) -> dict:
        from nbdev.showdoc import show_doc
        ns = {k: getattr(self.pkg, k) for k in getattr(self.pkg, '__all__', [])}
        if default_exp:
            mod = importlib.import_module(f'{self.lib}.{default_exp}' if default_exp != '__init__' else self.lib)
            ns.update(vars(mod))
        ns['show_doc'] = show_doc
        return ns

def _directives(src: str) -> tuple[dict, str]:
    "Quarto-style `#| key: value` lines (what nbdev leaves in the source) and the code without any `#|` line."
    d, code = {}, []
    for line in (src or '').splitlines():
        m = _re_dir.match(line)
        if m: d[m.group(1).lower()] = m.group(2).strip().strip('"\'')
        else: code.append(line)
    return d, '\n'.join(code).strip('\n')

def make_render_docs(ctx: Context, page: str):
    "nbdev processor standing in for `exec_show_docs` (see the module docstring)."
    from nbdev.process import Processor
    from nbdev.processors import _default_exp, _show_docs, _is_showdoc

    class render_docs(Processor):
        def begin(self):
            # nbdev's add_show_docs inserts the entries of a cell's definitions one by one at the same index, so they
            # come out in reverse order: put each run of them back in the order of the definitions
            cells, out, run = self.nb.cells, [], []
            for c in cells + [None]:
                if c is not None and c.get('has_sd'): run.append(c); continue
                out += run[::-1]; run = []
                if c is not None: out.append(c)
            self.nb.cells[:] = out
            self.ns = ctx.namespace(_default_exp(self.nb))
            self.shell, self.seen, self.entry_cells = None, set(), []
            self.nb_dir = Path(self.nb.path_).parent

        def _shell(self):
            if self.shell is None:
                from execnb.shell import CaptureShell
                self.shell = CaptureShell()
                self.shell.user_ns.update(self.ns)
            return self.shell

        def cell(self, cell):
            if cell.cell_type != 'code': return
            if _is_showdoc(cell): return self.show_doc(cell)
            if 'exec_doc' in (cell.directives_ or {}): return self.exec_doc(cell)

        def show_doc(self, cell):
            _, src = _directives(cell.source)
            parts = []
            for t in _show_docs(ast.parse(src).body):
                expr = ast.get_source_segment(src, t.value)
                ns = self.shell.user_ns if self.shell else self.ns
                entry = eval(compile(expr, f'<{page}: {expr}>', 'eval'), ns)
                if entry is None: continue
                key = getattr(entry, 'key', None)
                if key is not None:
                    if any(key is k for k in self.seen): continue   # documented once per page
                    self.seen.add(key)
                parts.append(entry)
            cell.cell_type, cell.source = 'markdown', '\n\n'.join(e._repr_markdown_() for e in parts)
            for k in ('outputs', 'execution_count'): cell.pop(k, None)
            self.entry_cells.append((cell, parts))

        def end(self):
            "Every member a class entry lists gets an entry: those documented nowhere else on the page go under the class."
            here = f'{page}.html'
            for cell, parts in self.entry_cells:
                out = []
                for e in parts:
                    out.append(e._repr_markdown_())
                    if e.kind not in ('class', 'dataclass'): continue
                    for _, raw in member_names(e.sym):
                        if (DocEntry.page_of(raw) or here) != here: continue
                        m = DocEntry(raw, title_level=e.level + 1)
                        if any(m.key is k for k in self.seen): continue
                        self.seen.add(m.key)
                        out.append(m._repr_markdown_())
                cell.source = '\n\n'.join(out)

        def exec_doc(self, cell):
            sh, cwd = self._shell(), os.getcwd()
            os.chdir(self.nb_dir)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter('ignore')
                    sh.cell(cell)
            finally: os.chdir(cwd)
            if sh.exc: raise RuntimeError(f'{page}: an `exec_doc` cell failed:\n{cell.source}') from sh.exc[1] if isinstance(sh.exc, tuple) else sh.exc
            for o in cell.get('outputs', []):
                if o.get('output_type') == 'error': raise RuntimeError(f'{page}: an `exec_doc` cell failed:\n{cell.source}\n{o.get("ename")}: {o.get("evalue")}')
            cell.execution_count = None
    return render_docs

_re_title = re.compile(r'^#\s+(\S.*?)\s*$', re.M)

def _split_title_cell(nb):
    "nbdev turns the first `# Title` cell into the title and description and drops the cell: keep what else it says."
    from execnb.nbio import mk_cell
    for i, c in enumerate(nb.cells):
        if c.cell_type != 'markdown' or not _re_title.search(c.source or ''): continue
        head, rest, in_head = [], [], True
        for l in c.source.splitlines():
            if in_head and (not l.strip() or _re_title.match(l) or l.startswith('>') or re.match(r'^-\s+\S.*:.*\S\s*$', l)): head.append(l)
            else: in_head = False; rest.append(l)
        if any(l.strip() for l in rest):
            c.source = '\n'.join(head)
            nb.cells.insert(i + 1, mk_cell('\n'.join(rest), 'markdown'))
        return

class Links:
    "Links between notebooks (`x.ipynb`) and to the published site (nbdev's `add_links`) point at this site's pages."
    def __init__(self, ctx: Context, pages: dict):
        self.ctx, self.pages = ctx, pages   # notebook path relative to nbs -> page name
    def __call__(self, text: str, nb_rel: Path) -> str:
        def nb_link(m):
            target, frag = m.group(2), m.group(3) or ''
            if '://' in target: return m.group(0)
            rel = Path(os.path.normpath((nb_rel.parent/target).as_posix())).as_posix()
            page = self.pages.get(rel)
            return f'{m.group(1)}{page}.html{frag}{m.group(4)}' if page else m.group(0)
        text = re.sub(r'(\]\(|href=")([^)"\s]+?\.ipynb)(#[^)"\s]*)?(\)|")', nb_link, text)
        if self.ctx.doc_prefix:
            text = text.replace(self.ctx.doc_prefix, '')
        return text

def _lines(s: str) -> list[str]:
    return [l + '\n' for l in s.split('\n')][:-1] + [s.split('\n')[-1]] if s else []

def _notice(text: str) -> dict:
    return nbformat.v4.new_output('display_data', data={'text/html': f'<p class="vq-notice">{text}</p>'})

def finish(nb, title: str, description: str, nb_rel: Path, links: Links) -> tuple[dict, set]:
    "The processed execnb notebook as a clean nbformat notebook for mkdocs-jupyter (directives applied)."
    cells, widgets = [], set()
    head = f'# {title}' + (f'\n\n> {description}' if description else '')
    cells.append(nbformat.v4.new_markdown_cell(links(head, nb_rel)))
    for c in nb.cells:
        if c.cell_type == 'raw' or c.source is None: continue
        if c.cell_type == 'markdown':
            if c.source.strip(): cells.append(nbformat.v4.new_markdown_cell(links(c.source, nb_rel)))
            continue
        d, src = _directives(c.source)
        if d.get('include') == 'false': continue
        outs = [] if d.get('output') == 'false' else [copy.deepcopy(dict(o)) for o in c.get('outputs', [])]
        if d.get('docs_widget'):   # the widget's kernel-free version replaces whatever the cell showed
            outs = [o for o in outs if WIDGET_VIEW in (o.get('data') or {})][:1] or [{'data': {WIDGET_VIEW: {}}}]
        new_outs, alts = [], [a.strip() for a in d.get('fig-alt', '').split(' | ') if a.strip()]
        for o in outs:
            data = o.get('data') or {}
            img = next((k for k in ('image/png', 'image/jpeg') if k in data), None)
            if img and WIDGET_VIEW not in data:   # a figure: shown with the alt text its cell gives (`#| fig-alt:`)
                if not alts: raise ValueError(f'{nb_rel}: a cell shows an image without alt text: give it `#| fig-alt: ` '
                                              f'(one text per image, separated by " | ")\n{src[:300]}')
                alt = alts.pop(0) if len(alts) > 1 else alts[0]
                b64 = ''.join(data[img]) if isinstance(data[img], list) else data[img]
                o = nbformat.v4.new_output('display_data', data={'text/html':
                    f'<img class="vq-figure" src="data:{img};base64,{b64.strip()}" alt="{html.escape(alt)}">'})
                new_outs.append(o); continue
            if WIDGET_VIEW in data:
                if d.get('docs_widget'):
                    name = re.sub(r'[^\w-]', '', d['docs_widget'])
                    widgets.add(name)
                    o = nbformat.v4.new_output('display_data', data={'text/html':
                        f'<div class="vq-widget" data-widget="{name}"><p class="vq-notice">Loading the interactive version '
                        f'(it runs in your browser, no kernel needed)...</p></div>'})
                else:
                    o = _notice('An interactive widget is here when the notebook runs in Jupyter; this static page '
                                'cannot run it.')
            elif 'text/markdown' in data:
                md = data['text/markdown']
                data['text/markdown'] = links(''.join(md) if isinstance(md, list) else md, nb_rel)
            new_outs.append(o)
        if not src.strip() and not new_outs: continue
        cell = nbformat.v4.new_code_cell(src)
        cell.outputs = [nbformat.from_dict(o) for o in new_outs]
        if d.get('echo') == 'false' or not src.strip(): cell.metadata['tags'] = ['remove_input']
        cells.append(cell)
    out = nbformat.v4.new_notebook(cells=cells, metadata={
        'kernelspec': {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'},
        'language_info': {'name': 'python'}})
    for i, c in enumerate(out.cells): c['id'] = f'c{i}'
    return out, widgets

def process(path: Path, ctx: Context, links: Links) -> Page:
    "One notebook through nbdev's processors and `render_docs`."
    from execnb.nbio import read_nb
    from nbdev.process import NBProcessor
    from nbdev.processors import FilterDefaults, exec_show_docs
    nb_rel = path.relative_to(ctx.nbs)
    name = page_name(nb_rel)
    nb = read_nb(path)
    nb.path_ = str(path)
    _split_title_cell(nb)
    render = make_render_docs(ctx, name)
    procs = [render if p is exec_show_docs else p for p in FilterDefaults().procs()]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        NBProcessor(nb=nb, procs=procs).process()
    fm = getattr(nb, 'frontmatter_', {}) or {}
    title = str(fm.get('title') or name)
    out, widgets = finish(nb, title, str(fm.get('description') or ''), nb_rel, links)
    return Page(name=name, title=title, source=path, nb=out, widgets=widgets)

def build_pages(root: Path, out_dir: Path, log=print) -> list[Page]:
    "Process every notebook into `out_dir/<page>.ipynb`; returns the pages in notebook order."
    cwd = os.getcwd()
    os.chdir(root)   # nbdev finds its settings.ini from the working directory
    try:
        ctx = Context(root)
        nbs = find_notebooks(ctx.nbs)
        links = Links(ctx, {p.relative_to(ctx.nbs).as_posix(): page_name(p.relative_to(ctx.nbs)) for p in nbs})
        out_dir.mkdir(parents=True, exist_ok=True)
        pages = []
        for p in nbs:
            page = process(p, ctx, links)
            nbformat.write(page.nb, out_dir/f'{page.name}.ipynb')
            pages.append(page)
            log(f'{p.relative_to(ctx.nbs)} -> {page.name}.html')
    finally: os.chdir(cwd)
    return pages
