#!/usr/bin/env python
"""Build the documentation site offline: nbdev's notebook processing, then MkDocs + Material.

    python scripts/build_docs.py            # writes the site to _docs/site/ (open _docs/site/index.html via a server)
    python scripts/build_docs.py --serve    # build, then serve it on http://127.0.0.1:8000

Quarto (what `nbdev_docs` uses) cannot be installed everywhere, so this is the default builder. It
keeps nbdev's semantics and leaves nbdev's Quarto files (nbs/_quarto.yml, nbs/nbdev.yml) alone, so
`nbdev_docs` still works wherever Quarto is installed.

Pipeline:
1. every notebook under nbs/ (file-name order, `index.ipynb` first; names starting with `_` or `.`
   are skipped, as nbdev does) goes through nbdev's own processors (`nbdev.processors.FilterDefaults`):
   directives stripped, `#| hide`/`#| export` cells dropped, `show_doc` cells added after exported
   definitions, backticked symbols linked. nbdev's `exec_show_docs`, which runs the notebook's import
   and export cells in a kernel, is replaced by `render_show_docs`: it imports the exported package and
   renders each `show_doc(...)` call with nbdev's `BasicMarkdownRenderer` (signature, docstring, the
   fastcore `docments` parameter comments). No notebook code is executed: every other output is the
   one committed in the notebook.
2. each processed notebook becomes a Markdown page (outputs, images, MathML for `$...$`, Quarto
   callouts as admonitions, ipywidgets as embedded widget views);
3. one API reference page per exported module (`veloxquant_mlx/_modidx.py` + `__all__`);
4. MkDocs + Material build the site, with the search index built locally and no asset on a CDN.

Widgets: the notebook must be saved with its widget state (`metadata.widgets`, which nbdev_clean
keeps). The page then loads `@jupyter-widgets/html-manager`'s `embed.js`, fetched once from the npm
registry (`npm pack`, integrity-checked, cached in ~/.cache/veloxquant_mlx-docs) and served from the
site itself. Widgets render from their saved state without a kernel: controls move and `jslink`ed
controls follow each other, but Python callbacks (`interact`) cannot run, so their output stays the
one saved. If the bundle cannot be had, pages fall back to the saved static outputs.
"""
from __future__ import annotations

import argparse, ast, base64, contextlib, copy, hashlib, html, importlib, io, json, os, pkgutil, re, shutil
import subprocess, sys, tarfile, tempfile, time, urllib.request, warnings
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent
ASSETS = HERE/'docs'

# @jupyter-widgets/html-manager 1.0.x renders ipywidgets 8 state (controls 2.0.0, output 1.0.0).
WIDGETS_PKG, WIDGETS_VER = '@jupyter-widgets/html-manager', '1.0.15'
WIDGETS_SHA512 = 'sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA=='
WIDGETS_TARBALL = 'https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.15.tgz'
BUILTIN_WIDGET_MODULES = {'@jupyter-widgets/base', '@jupyter-widgets/controls', '@jupyter-widgets/output'}
WIDGET_STATE = 'application/vnd.jupyter.widget-state+json'
WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json'

def log(*a): print('[build_docs]', *a, file=sys.stderr, flush=True)

# ----------------------------------------------------------------------------------------------
# notebooks

def find_notebooks(nbs: Path) -> list[Path]:
    "Every notebook under `nbs`, `index.ipynb` first then in file-name order; `_`/`.` names skipped (as nbdev)."
    res = []
    for p in nbs.rglob('*.ipynb'):
        rel = p.relative_to(nbs)
        if any(part.startswith(('_', '.')) for part in rel.parts): continue
        res.append(p)
    return sorted(res, key=lambda p: (p.relative_to(nbs).as_posix() != 'index.ipynb', p.relative_to(nbs).as_posix()))

def page_path(nb_rel: PurePosixPath) -> PurePosixPath:
    "The Markdown page of a notebook: nbdev's HTML name (`00_proxy.ipynb` -> `proxy.html`) as `.md`."
    from nbdev.doclinks import _nbpath2html
    return PurePosixPath(_nbpath2html(Path(nb_rel)).with_suffix('.md').as_posix())

def relpath(target: PurePosixPath, start_dir: PurePosixPath) -> str:
    return os.path.relpath(target.as_posix(), start_dir.as_posix() or '.').replace(os.sep, '/')

_re_title = re.compile(r'^#\s+(\S.*?)\s*$', re.M)

def split_title_cell(nb):
    """nbdev's FrontmatterProc turns the first `# Title` markdown cell into frontmatter and drops the
    whole cell; keep whatever else that cell says (paragraphs after the title and `> description`)."""
    from execnb.nbio import mk_cell
    if any(c.cell_type == 'raw' and 'title:' in (c.source or '') for c in nb.cells): return
    for i, c in enumerate(nb.cells):
        if c.cell_type != 'markdown' or not _re_title.search(c.source or ''): continue
        lines, head, rest, in_head = c.source.splitlines(), [], [], True
        for l in lines:
            if in_head and (not l.strip() or _re_title.match(l) or l.startswith('>') or re.match(r'^-\s+\S.*:.*\S\s*$', l)):
                head.append(l)
            else: in_head = False; rest.append(l)
        if any(l.strip() for l in rest):
            c.source = '\n'.join(head)
            nb.cells.insert(i + 1, mk_cell('\n'.join(rest), 'markdown'))
        return

class ShowDocs:
    "Renders `show_doc(...)` calls from the imported package (no notebook code runs)."
    def __init__(self, lib_name: str):
        self.lib_name, self.mods, self.errors = lib_name, {}, []
        self.base_ns = {}
        try:
            pkg = importlib.import_module(lib_name)
            self.base_ns.update({k: v for k, v in vars(pkg).items() if not k.startswith('_')})
            for m in pkgutil.iter_modules(pkg.__path__):
                if m.name.startswith('_'): continue
                mod = self.module(f'{lib_name}.{m.name}')
                if mod: self.base_ns.update({k: getattr(mod, k) for k in getattr(mod, '__all__', []) if hasattr(mod, k)})
        except Exception as e: self.errors.append(f'import {lib_name}: {e!r}')

    def module(self, name):
        if name not in self.mods:
            try: self.mods[name] = importlib.import_module(name)
            except Exception as e:
                self.mods[name] = None
                self.errors.append(f'import {name}: {e!r}')
                log(f'WARNING: cannot import {name} ({e!r}); its show_doc entries fall back to saved outputs')
        return self.mods[name]

    def namespace(self, default_exp):
        from nbdev.showdoc import show_doc
        ns = dict(self.base_ns)
        mod = self.module(f'{self.lib_name}.{default_exp}') if default_exp else None
        if mod: ns.update(vars(mod))
        ns['show_doc'] = show_doc
        return ns

    def render(self, expr_src: str, ns: dict) -> str:
        res = eval(compile(expr_src, '<show_doc>', 'eval'), ns)
        if res is None: raise ValueError('show_doc returned nothing')
        return res._repr_markdown_()

def make_render_show_docs(show_docs: ShowDocs):
    "A stand-in for `nbdev.processors.exec_show_docs` that renders from the package instead of a kernel."
    from nbdev.process import Processor
    from nbdev.processors import _is_showdoc, _default_exp, _show_docs
    from execnb.nbio import mk_cell

    class render_show_docs(Processor):
        "Render `show_doc` cells with nbdev's markdown renderer, importing the exported package."
        def begin(self): self.ns = show_docs.namespace(_default_exp(self.nb))
        def cell(self, cell):
            if not _is_showdoc(cell): return
            src = '\n'.join(l for l in cell.source.splitlines() if not l.lstrip().startswith('#|'))
            try: trees = _show_docs(ast.parse(src).body)
            except SyntaxError: trees = []
            parts, failed = [], []
            for t in trees:
                expr = ast.get_source_segment(src, t.value)
                try: parts.append(show_docs.render(expr, self.ns))
                except Exception as e: failed.append((expr, e))
            if failed:
                saved = [o for o in cell.get('outputs', []) if 'text/markdown' in o.get('data', {})]
                if saved: return  # the notebook was saved with its rendered show_doc: keep that
                for expr, e in failed:
                    log(f'WARNING: {getattr(self.nb, "path_", "?")}: cannot render {expr}: {e!r}')
                    parts.append(f'---\n\n### {expr}\n\n*(not rendered: {type(e).__name__})*\n')
            cell.outputs = [dict(output_type='display_data', metadata={}, data={'text/markdown': ''.join(parts)})]
            cell.execution_count = None
    return render_show_docs

def process_notebook(path: Path, show_docs: ShowDocs):
    "Run nbdev's docs processors over one notebook; returns the processed notebook."
    from execnb.nbio import read_nb
    from nbdev.process import NBProcessor
    from nbdev.processors import FilterDefaults, exec_show_docs
    nb = read_nb(path)
    nb.path_ = str(path)
    split_title_cell(nb)
    render = make_render_show_docs(show_docs)
    procs = [render if p is exec_show_docs else p for p in FilterDefaults().procs()]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        NBProcessor(nb=nb, procs=procs).process()
    return nb

# ----------------------------------------------------------------------------------------------
# Markdown for one processed notebook

_re_directive = re.compile(r'^\s*#\|\s*([\w-]+)\s*:\s*(.*?)\s*$')
_re_ansi = re.compile(r'\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])')
_re_fence = re.compile(r'^(\s*)(`{3,}|~{3,})')

def fence(text: str, lang: str = '', attrs: str = '') -> str:
    ticks = '`' * max(3, 1 + max((len(m) for m in re.findall(r'`+', text)), default=0))
    head = f'{ticks} {{ {attrs} }}' if attrs else f'{ticks}{lang}'
    return f'{head}\n{text.rstrip()}\n{ticks}'

def join_text(t): return ''.join(t) if isinstance(t, list) else (t or '')

def code_directives(src: str):
    "Split Quarto-style `#| key: value` lines (what nbdev leaves for Quarto) from the top of a code cell."
    lines, d = src.splitlines(), {}
    while lines and (m := _re_directive.match(lines[0])):
        d[m.group(1).lower()] = m.group(2).strip().strip('"\'')
        lines.pop(0)
    lines = [l for l in lines if not l.lstrip().startswith('#|')]
    return d, '\n'.join(lines).strip('\n')

def split_code(md: str):
    "Yield (is_code, text) chunks of markdown: fenced blocks and inline code spans are code."
    out, buf, lines, i = [], [], md.split('\n'), 0
    while i < len(lines):
        m = _re_fence.match(lines[i])
        if m:
            if buf: out.append((False, '\n'.join(buf) + '\n')); buf = []
            block, tick = [lines[i]], m.group(2)
            i += 1
            while i < len(lines):
                block.append(lines[i])
                if lines[i].strip().startswith(tick[0] * len(tick)) and lines[i].strip().strip(tick[0]) == '': i += 1; break
                i += 1
            out.append((True, '\n'.join(block) + '\n'))
            continue
        buf.append(lines[i]); i += 1
    if buf: out.append((False, '\n'.join(buf)))
    res = []
    for is_code, text in out:
        if is_code: res.append((True, text)); continue
        pos = 0
        for m in re.finditer(r'(`+)(?!`).*?(?<!`)\1(?!`)', text, re.S):
            res.append((False, text[pos:m.start()])); res.append((True, m.group(0))); pos = m.end()
        res.append((False, text[pos:]))
    return res

_md_escape = {c: f'&#{ord(c)};' for c in '\\*_`[]{}$!|~^'}  # not `#`/`&`: entities stay entities

def mathml(latex: str, display: bool) -> str:
    from latex2mathml.converter import convert
    res = convert(latex.strip(), display='block' if display else 'inline')
    # text between tags must not be read as Markdown (`*`, `_`, ...) by Python-Markdown
    def text(m):
        t = html.escape(html.unescape(m.group(1)), quote=False)
        return '>' + ''.join(_md_escape.get(c, c) for c in t) + '<'
    return re.sub(r'>([^<]+)<', text, res)

_re_display_math = re.compile(r'\$\$(.+?)\$\$', re.S)
_re_inline_math = re.compile(r'(?<![\\$\w])\$(?![\s$])([^$\n]+?)(?<![\s\\])\$(?![\w$])')

def convert_math(text: str) -> str:
    def disp(m):
        try: return f'\n\n<div class="nb-math">{mathml(m.group(1), True)}</div>\n\n'
        except Exception: return m.group(0)
    def inl(m):
        try: return mathml(m.group(1), False)
        except Exception: return m.group(0)
    return _re_inline_math.sub(inl, _re_display_math.sub(disp, text))

_callouts = {'note': 'note', 'tip': 'tip', 'warning': 'warning', 'important': 'danger', 'caution': 'warning'}

def quarto_divs(md: str) -> str:
    "Quarto fenced divs (`::: {.callout-note}`) to Material admonitions / md_in_html divs."
    out, depth, pending_title = [], 0, None
    for line in md.split('\n'):
        m = re.match(r'^\s*:{3,}\s*\{([^}]*)\}\s*$', line) or re.match(r'^\s*:{3,}\s*([\w-]+)\s*$', line)
        if m:
            attrs = m.group(1)
            classes = re.findall(r'\.([\w-]+)', attrs) or ([attrs] if re.fullmatch(r'[\w-]+', attrs) else [])
            title = re.search(r'title\s*=\s*"([^"]*)"', attrs)
            kind = next((c[len('callout-'):] for c in classes if c.startswith('callout-')), None)
            if kind:
                cls = f'admonition {_callouts.get(kind, "note")}'
                out += ['', f'<div class="{cls}" markdown="1">', '']
                pending_title = title.group(1) if title else kind.capitalize()
            else:
                out += ['', f'<div class="{" ".join(classes)}" markdown="1">', '']
            depth += 1
            continue
        if depth and re.match(r'^\s*:{3,}\s*$', line):
            if pending_title: out += [f'<p class="admonition-title">{html.escape(pending_title)}</p>', '']; pending_title = None
            out += ['', '</div>', '']; depth -= 1
            continue
        if pending_title is not None:
            if not line.strip(): continue
            h = re.match(r'^#{1,6}\s+(.*)$', line)
            out += [f'<p class="admonition-title">{html.escape(h.group(1) if h else pending_title)}</p>', '']
            pending_title = None
            if h: continue
        out.append(line)
    out += ['', '</div>', ''] * depth
    return '\n'.join(out)

class PageWriter:
    "Turns one processed notebook into Markdown, writing its images next to the page."
    def __init__(self, site, nb, nb_rel: PurePosixPath, page: PurePosixPath):
        self.site, self.nb, self.nb_rel, self.page = site, nb, nb_rel, page
        self.page_dir = page.parent
        self.files_dir = page.parent/f'{page.stem}_files'
        self.n_files, self.has_widgets = 0, False
        state = (nb.metadata.get('widgets') or {}).get(WIDGET_STATE) or {}
        self.widget_state = state if state.get('state') else None
        self.embed = bool(self.widget_state) and site.widget_bundle is not None and self._builtin_only()

    def _builtin_only(self):
        mods = {m.get('model_module') for m in self.widget_state['state'].values()} | \
               {m.get('state', {}).get('_view_module') for m in self.widget_state['state'].values()}
        extra = {m for m in mods if m and m not in BUILTIN_WIDGET_MODULES}
        if extra: log(f'WARNING: {self.nb_rel}: widgets from {sorted(extra)} need a CDN: shown as static outputs')
        return not extra

    def write_file(self, data: bytes, ext: str) -> str:
        self.n_files += 1
        rel = self.files_dir/f'output_{self.n_files}.{ext}'
        dest = self.site.docs_dir/rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        return relpath(rel, self.page_dir)

    # -- links
    def fix_links(self, md: str) -> str:
        prefix = self.site.doc_prefix
        def nb_link(m):
            target, frag = m.group(2), m.group(3) or ''
            if '://' in target: return m.group(0)
            dest = PurePosixPath(os.path.normpath((self.nb_rel.parent/target).as_posix()))
            return f'{m.group(1)}{relpath(page_path(dest), self.page_dir)}{frag})'
        md = re.sub(r'(\]\()([^)\s]+?\.ipynb)(#[^)\s]*)?\)', nb_link, md)
        if prefix:  # nbdev's add_links points at the published (Quarto) site: point at this one
            def doc_link(m):
                url = m.group(2)
                page, _, frag = url[len(prefix):].partition('#')
                target = PurePosixPath(page).with_suffix('.md')
                if target.as_posix() not in self.site.page_set: return m.group(0)
                return f'{m.group(1)}{relpath(target, self.page_dir)}{"#" + frag if frag else ""})'
            md = re.sub(r'(\]\()(' + re.escape(prefix) + r'[^)\s]*)\)', doc_link, md)
        return md

    def markdown_cell(self, cell) -> str:
        src = join_text(cell.source)
        for name, att in (cell.get('attachments') or {}).items():
            for mime, data in att.items():
                if mime.startswith('image/'):
                    url = self.write_file(base64.b64decode(join_text(data)), mime.split('/')[1].split('+')[0])
                    src = src.replace(f'attachment:{name}', url)
                    break
        for p in re.findall(r'\]\(([^)\s#]+)', src) + re.findall(r'src="([^"#]+)"', src):
            if '://' not in p and not p.startswith(('data:', '/', '#')): self.site.want_asset(self.nb_rel.parent, p)
        parts = [t if is_code else convert_math(t) for is_code, t in split_code(src)]
        return self.fix_links(quarto_divs(''.join(parts)))

    def show_doc_md(self, md: str) -> str:
        "nbdev's show_doc markdown, with nbdev's anchors (`name.lower()`) and a Material-friendly source link."
        def head(m):
            name = m.group(2).strip()
            esc = name.replace('_', r'\_')
            return f'{m.group(1)} {esc} {{ #{name.lower()} data-toc-label="{html.escape(name)}" }}'
        md = re.sub(r'^(#{1,6}) (\S+)[ \t]*$', head, md, count=1, flags=re.M)
        md = re.sub(r'\[source\]\(([^)]*)\)\{[^}]*\}', lambda m: '' if m.group(1).endswith('#LNone') else
                    f'[source]({m.group(1)}){{ .vq-source target="_blank" }}', md)
        return self.fix_links(md)

    def output(self, o, is_show_doc=False) -> str:
        ot = o.get('output_type')
        if ot == 'stream':
            return fence(_re_ansi.sub('', join_text(o.get('text'))), attrs='.text .nb-output')
        if ot == 'error':
            tb = _re_ansi.sub('', '\n'.join(o.get('traceback') or [f"{o.get('ename')}: {o.get('evalue')}"]))
            return f'<div class="nb-output nb-error" markdown="1">\n\n{fence(tb, "text")}\n\n</div>'
        data = o.get('data') or {}
        if WIDGET_VIEW in data:
            view = data[WIDGET_VIEW]
            if self.embed and view.get('model_id') in self.widget_state['state']:
                self.has_widgets = True
                return f'<script type="{WIDGET_VIEW}">{_script_json(view)}</script>'
            if not any(k.startswith('image/') or k == 'text/html' for k in data):
                return '<p class="nb-widget-note">(interactive widget: run the notebook to use it)</p>'
        if 'text/markdown' in data:
            md = join_text(data['text/markdown'])
            return self.show_doc_md(md) if is_show_doc else self.fix_links(md)
        if 'text/html' in data:
            h = join_text(data['text/html']).strip()
            return f'<div class="nb-output nb-html">\n{h}\n</div>'
        for mime, ext in (('image/svg+xml', 'svg'), ('image/png', 'png'), ('image/jpeg', 'jpg'), ('image/gif', 'gif')):
            if mime in data:
                raw = join_text(data[mime])
                blob = raw.encode() if mime == 'image/svg+xml' else base64.b64decode(raw)
                return f'<div class="nb-output" markdown="1">\n\n![output]({self.write_file(blob, ext)})\n\n</div>'
        if 'text/latex' in data: return convert_math(join_text(data['text/latex']))
        if 'text/plain' in data: return fence(_re_ansi.sub('', join_text(data['text/plain'])), attrs='.text .nb-output')
        return ''

    def code_cell(self, cell) -> str:
        d, src = code_directives(join_text(cell.source))
        if d.get('include') == 'false': return ''
        from nbdev.processors import _is_showdoc
        is_show_doc = bool(_is_showdoc(cell))
        parts = []
        if src.strip() and d.get('echo') != 'false' and not is_show_doc:
            code = fence(src, 'python')
            if 'code-fold' in d:
                summary = html.escape(d.get('code-summary', 'Code'))
                opn = ' open' if d['code-fold'] == 'show' else ''
                code = f'<details class="nb-fold"{opn} markdown="1">\n<summary>{summary}</summary>\n\n{code}\n\n</details>'
            parts.append(code)
        if d.get('output') != 'false':
            outs = list(cell.get('outputs') or [])
            merged = []  # consecutive stream outputs of one name read as one block
            for o in outs:
                if merged and o.get('output_type') == 'stream' and merged[-1].get('output_type') == 'stream' \
                   and merged[-1].get('name') == o.get('name'):
                    merged[-1] = dict(merged[-1], text=join_text(merged[-1]['text']) + join_text(o.get('text')))
                else: merged.append(dict(o))
            parts += [self.output(o, is_show_doc) for o in merged]
        return '\n\n'.join(p for p in parts if p)

    def raw_cell(self, cell) -> str:
        fmt = (cell.metadata.get('format') or cell.metadata.get('raw_mimetype') or '').lower()
        return join_text(cell.source) if fmt in ('text/html', 'html', 'text/markdown', 'markdown') else ''

    def render(self) -> tuple[str, str]:
        fm = getattr(self.nb, 'frontmatter_', {}) or {}
        title = str(fm.get('title') or self.nb_rel.stem)
        body = []
        for cell in self.nb.cells:
            if cell.cell_type == 'markdown': body.append(self.markdown_cell(cell))
            elif cell.cell_type == 'code': body.append(self.code_cell(cell))
            elif cell.cell_type == 'raw': body.append(self.raw_cell(cell))
        head = [f'# {title}']
        if fm.get('description'): head.append(f'{fm["description"]}\n{{: .nb-description }}')
        if self.has_widgets:
            js = relpath(PurePosixPath('assets/widgets/embed.js'), self.page_dir)
            head.append(f'<script type="{WIDGET_STATE}">{_script_json(self.widget_state)}</script>\n'
                        f'<script src="{js}"></script>')
        md = '\n\n'.join(head + [b.strip('\n') for b in body if b and b.strip()]) + '\n'
        return title, md

def _script_json(obj) -> str:
    return json.dumps(obj).replace('</', '<\\/')

# ----------------------------------------------------------------------------------------------
# API reference

def api_pages(site, show_docs: ShowDocs):
    "One page per exported module: every name in `__all__`, and the public methods of exported classes."
    lib = site.lib_name
    try: modidx = importlib.import_module(f'{lib}._modidx').d.get('syms', {})
    except Exception: modidx = {}
    site.modidx = modidx
    names = set(modidx)
    try:
        pkg = importlib.import_module(lib)
        names |= {f'{lib}.{m.name}' for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith('_')}
    except Exception: pass
    def order(mod):
        locs = [v[0] for v in modidx.get(mod, {}).values() if isinstance(v, (list, tuple))]
        page = locs[0].split('#')[0].replace('.html', '.md') if locs else ''
        return (site.page_order.get(page, 10**6), mod)
    pages = []
    from nbdev.showdoc import BasicMarkdownRenderer
    for mod_name in sorted(names, key=order):
        mod = show_docs.module(mod_name)
        if mod is None: continue
        entries = modidx.get(mod_name, {})
        exported = list(getattr(mod, '__all__', None) or
                        [k.rsplit('.', 1)[1] for k in entries if k.count('.') == mod_name.count('.') + 1 and not k.rsplit('.', 1)[1].startswith('_')])
        short = mod_name[len(lib) + 1:]
        rel = PurePosixPath(f'reference/{short}.md')
        doc = mod.__doc__.strip() if mod.__doc__ else ''
        lines = [f'# {mod_name}', '']
        if doc: lines += [doc, '']
        lines += [f'```python\nfrom {mod_name} import *\n```', '']
        symbols = []
        for name in exported:
            obj = getattr(mod, name, None)
            key = f'{mod_name}.{name}'
            symbols.append(name)
            lines += _api_entry(site, rel, name, obj, entries.get(key), 2, BasicMarkdownRenderer)
            if isinstance(obj, type):
                for k in entries:
                    if not k.startswith(key + '.'): continue
                    meth = k[len(key) + 1:]
                    if '.' in meth or (meth.startswith('_') and meth not in ('__call__',)): continue
                    lines += _api_entry(site, rel, f'{name}.{meth}', getattr(obj, meth, None), entries.get(k), 3, BasicMarkdownRenderer)
        (site.docs_dir/rel).parent.mkdir(parents=True, exist_ok=True)
        (site.docs_dir/rel).write_text('\n'.join(lines) + '\n')
        pages.append((mod_name, rel, symbols))
    idx = ['# API reference', '',
           f'Every name that `{lib}` exports, with its signature, docstring and parameter docs, one page per module. '
           'The notebook pages show the same entries in context.', '']
    for mod_name, rel, symbols in pages:
        idx.append(f'## [{mod_name}]({rel.name})\n')
        idx += [f'- [`{s}`]({rel.name}#{s.lower()})' for s in symbols] + ['']
    (site.docs_dir/'reference').mkdir(parents=True, exist_ok=True)
    (site.docs_dir/'reference/index.md').write_text('\n'.join(idx) + '\n')
    return pages

def _api_entry(site, rel, name, obj, loc, level, Renderer):
    anchor = name.lower()
    esc = name.replace('_', r'\_')
    out = [f'{"#" * level} {esc} {{ #{anchor} data-toc-label="{html.escape(name)}" }}', '']
    if obj is None: return out + ['*(not found in the module)*', '']
    if not (callable(obj) or isinstance(obj, type)):  # a constant: its value, not its type's docstring
        r = repr(obj)
        return out + [fence(f'{name} = {r if len(r) < 600 else r[:600] + " ..."}', 'python'), '']
    try:
        md = Renderer(obj, name=name, title_level=level)._repr_markdown_()
        md = re.sub(r'^---\s*\n', '', md)
        md = re.sub(r'\[source\]\([^)]*\)\{[^}]*\}\s*', '', md)
        md = re.sub(r'^#{1,6} .*\n', '', md, count=1, flags=re.M)  # our own heading above
    except Exception:
        if callable(obj) or isinstance(obj, type): md = f'*{(obj.__doc__ or "").strip()}*'
        else: md = fence(repr(obj), 'python')
    if not callable(obj) and not isinstance(obj, type) and not md.strip():
        md = fence(f'{name} = {obj!r}', 'python')
    out += [md.strip(), '']
    if loc:
        page, _, frag = loc[0].partition('#')
        target = PurePosixPath(page).with_suffix('.md')
        if target.as_posix() in site.page_set:
            title = site.page_titles.get(target.as_posix(), target.stem)
            out += [f'Explained in [{title}]({relpath(target, rel.parent)}#{frag})\n{{: .vq-defined-in }}', '']
    return out

# ----------------------------------------------------------------------------------------------
# widgets bundle (npm registry, integrity-checked, cached)

def widget_bundle(cache: Path) -> Path | None:
    "Path to html-manager's `embed.js` (no RequireJS needed for the built-in controls), or None."
    dest = cache/f'html-manager-{WIDGETS_VER}'
    if (dest/'embed.js').exists(): return dest
    with tempfile.TemporaryDirectory() as tmp:
        tgz = None
        if shutil.which('npm'):
            try:
                r = subprocess.run(['npm', 'pack', f'{WIDGETS_PKG}@{WIDGETS_VER}', '--pack-destination', tmp, '--silent'],
                                   capture_output=True, text=True, timeout=120)
                found = list(Path(tmp).glob('*.tgz'))
                if r.returncode == 0 and found: tgz = found[0]
                else: log(f'npm pack failed: {r.stderr.strip()[-300:]}')
            except Exception as e: log(f'npm pack failed: {e!r}')
        if tgz is None:
            try:
                tgz = Path(tmp)/'pkg.tgz'
                with urllib.request.urlopen(WIDGETS_TARBALL, timeout=60) as resp: tgz.write_bytes(resp.read())
            except Exception as e:
                log(f'WARNING: cannot fetch {WIDGETS_PKG}@{WIDGETS_VER} from the npm registry ({e!r}): widgets stay static')
                return None
        data = tgz.read_bytes()
        got = 'sha512-' + base64.b64encode(hashlib.sha512(data).digest()).decode()
        if got != WIDGETS_SHA512:
            log(f'WARNING: {WIDGETS_PKG} tarball integrity mismatch: widgets stay static'); return None
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            js = tf.extractfile('package/dist/embed.js').read().decode()
            lic = tf.extractfile('package/dist/embed.js.LICENSE.txt').read()
            try: pkg_lic = tf.extractfile('package/LICENSE').read()
            except Exception: pkg_lic = b'BSD-3-Clause, Jupyter Project (see @jupyter-widgets/html-manager on npm)\n'
        js = re.sub(r'\n//# sourceMappingURL=\S+\s*$', '\n', js)
        tmpdest = Path(tempfile.mkdtemp(dir=cache.parent if cache.parent.exists() else None))
        (tmpdest/'embed.js').write_text(js)
        (tmpdest/'embed.js.LICENSE.txt').write_bytes(lic)
        (tmpdest/'LICENSE').write_bytes(pkg_lic)
        cache.mkdir(parents=True, exist_ok=True)
        if dest.exists(): shutil.rmtree(tmpdest)
        else: tmpdest.rename(dest)
    return dest

# ----------------------------------------------------------------------------------------------
# the site

MEDIA = {'.png', '.jpg', '.jpeg', '.gif', '.svg', '.webp', '.ico', '.pdf', '.mp4', '.webm'}

class Site:
    def __init__(self, root: Path, out: Path, widgets: bool = True):
        from nbdev.config import get_config
        self.root, self.out = root, out
        os.chdir(root)
        if str(root) not in sys.path: sys.path.insert(0, str(root))  # the checkout's package, not an installed copy
        get_config.cache_clear()
        self.cfg = get_config(path=root)
        self.lib_name = self.cfg.lib_name
        self.nbs = Path(self.cfg.nbs_path)
        host, base = self.cfg.get('doc_host', ''), self.cfg.get('doc_baseurl', '')
        self.doc_prefix = f'{host.rstrip("/")}/{base.strip("/")}/'.replace('//', '/').replace(':/', '://') if host else ''
        self.build_dir, self.site_dir = out/'build', out/'site'
        self.docs_dir = self.build_dir/'docs'
        self.cache = Path(os.environ.get('XDG_CACHE_HOME', Path.home()/'.cache'))/'veloxquant_mlx-docs'
        self.widget_bundle = widget_bundle(self.cache) if widgets else None
        self.assets_wanted = set()
        self.page_set, self.page_order, self.page_titles = set(), {}, {}

    def want_asset(self, nb_dir: PurePosixPath, p: str):
        self.assets_wanted.add(PurePosixPath(os.path.normpath((nb_dir/p).as_posix())))

    def copy_assets(self):
        "Images and other media under nbs/ (and any file a markdown cell links to), at the same relative paths."
        files = set()
        for p in self.nbs.rglob('*'):
            rel = p.relative_to(self.nbs)
            if p.is_file() and p.suffix.lower() in MEDIA and not any(s.startswith(('.', '_')) for s in rel.parts):
                files.add(PurePosixPath(rel.as_posix()))
        files |= {a for a in self.assets_wanted if (self.nbs/a).is_file() and not a.as_posix().startswith('..')}
        for rel in files:
            if rel.suffix == '.ipynb' or rel.as_posix() in self.page_set: continue
            dest = self.docs_dir/rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.nbs/rel, dest)

    def build(self, strict_notebooks: bool = True):
        t0 = time.time()
        shutil.rmtree(self.build_dir, ignore_errors=True)
        self.docs_dir.mkdir(parents=True)
        notebooks = find_notebooks(self.nbs)
        rels = [PurePosixPath(p.relative_to(self.nbs).as_posix()) for p in notebooks]
        pages = [page_path(r) for r in rels]
        self.page_set = {p.as_posix() for p in pages}
        self.page_order = {p.as_posix(): i for i, p in enumerate(pages)}
        show_docs = ShowDocs(self.lib_name)
        nav, failures = [], []
        for path, rel, page in zip(notebooks, rels, pages):
            try: nb = process_notebook(path, show_docs)
            except Exception as e:
                failures.append(f'{rel}: {e!r}')
                log(f'ERROR: {rel}: {e!r}')
                continue
            writer = PageWriter(self, nb, rel, page)
            title, md = writer.render()
            self.page_titles[page.as_posix()] = title
            (self.docs_dir/page).parent.mkdir(parents=True, exist_ok=True)
            (self.docs_dir/page).write_text(md)
            nav.append({title: page.as_posix()})
            log(f'{rel} -> {page}{"  (live widgets)" if writer.has_widgets else ""}')
        if failures and strict_notebooks:
            raise SystemExit('notebooks that could not be processed:\n  ' + '\n  '.join(failures))
        api = api_pages(self, show_docs)
        if api:
            nav.append({'API reference': ['reference/index.md'] + [{m: r.as_posix()} for m, r, _ in api]})
        self.repair_anchors(api)
        self.copy_assets()
        (self.docs_dir/'assets').mkdir(exist_ok=True)
        shutil.copy2(ASSETS/'notebook.css', self.docs_dir/'assets/notebook.css')
        if self.widget_bundle is not None:
            shutil.copytree(self.widget_bundle, self.docs_dir/'assets/widgets', dirs_exist_ok=True)
        self.write_config(nav)
        self.run_mkdocs()
        log(f'site: {self.site_dir} ({len(nav)} nav entries, {time.time() - t0:.1f}s)')
        return self.site_dir

    def repair_anchors(self, api):
        """nbdev links every symbol of `_modidx.py` to `page.html#name`, but a notebook page only has an anchor for
        what it `show_doc`s. Point such links at the symbol's API reference entry (or the class, or the page)."""
        from markdown.extensions.toc import slugify
        mds = {p.relative_to(self.docs_dir).as_posix(): p for p in self.docs_dir.rglob('*.md')}
        anchors = {}
        for rel, p in mds.items():
            ids = set()
            for m in re.finditer(r'^#{1,6}\s+(.*?)\s*$', p.read_text(), re.M):
                h = m.group(1)
                a = re.search(r'\{[^}]*#([^\s}]+)[^}]*\}\s*$', h)
                if a: ids.add(a.group(1)); continue
                h = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', h).replace('\\_', '_').replace('`', '')
                ids.add(slugify(h, '-'))
            anchors[rel] = ids
        ref = {}  # (notebook page, anchor) -> reference page of that symbol's module
        for mod_name, rel, _ in api:
            for key, loc in self.modidx.get(mod_name, {}).items():
                if isinstance(loc, (list, tuple)):
                    page, _, frag = loc[0].partition('#')
                    ref[(PurePosixPath(page).with_suffix('.md').as_posix(), frag)] = rel.as_posix()
        def fix(src_rel, m):
            target = PurePosixPath(os.path.normpath((PurePosixPath(src_rel).parent/m.group(1)).as_posix())).as_posix()
            frag = m.group(2)
            if target not in anchors or frag in anchors[target]: return m.group(0)
            alt = ref.get((target, frag))
            if alt and alt != src_rel and frag in anchors.get(alt, ()):
                return f'({relpath(PurePosixPath(alt), PurePosixPath(src_rel).parent)}#{frag})'
            parent = frag.rsplit('.', 1)[0]
            if '.' in frag and parent in anchors[target]: return f'({m.group(1)}#{parent})'
            return f'({m.group(1)})'
        for rel, p in mds.items():
            text = p.read_text()
            new = re.sub(r'\(([^()\s]+?\.md)#([^()\s]+)\)', lambda m: fix(rel, m), text)
            if new != text: p.write_text(new)

    def write_config(self, nav):
        import yaml
        cfg = yaml.safe_load((ASSETS/'mkdocs.base.yml').read_text())
        cfg.update(site_name=self.cfg.get('title', self.lib_name), site_description=self.cfg.get('description', ''),
                   docs_dir=str(self.docs_dir), site_dir=str(self.site_dir), nav=nav,
                   copyright=f'Copyright {self.cfg.get("copyright", "")}'.strip())
        (self.build_dir/'mkdocs.yml').write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))

    def run_mkdocs(self):
        from mkdocs.commands.build import build
        from mkdocs.config import load_config
        import logging
        logging.getLogger('mkdocs').setLevel(logging.WARNING)
        shutil.rmtree(self.site_dir, ignore_errors=True)
        with contextlib.redirect_stdout(sys.stderr):
            build(load_config(str(self.build_dir/'mkdocs.yml')))
        # Material ships a Google Fonts preconnect only when font is set; check nothing slipped in
        bad = []
        for f in self.site_dir.rglob('*.html'):
            for m in re.finditer(r'<(?:script|img|link|iframe|source|video|audio)\b[^>]*?\b(?:src|href)="(https?:)?//([^"]+)"', f.read_text()):
                tag = m.group(0)
                if tag.startswith('<link') and not re.search(r'rel="(stylesheet|preload|icon|modulepreload|preconnect)', tag): continue
                bad.append(f'{f.relative_to(self.site_dir)}: {tag[:120]}')
        if bad: raise SystemExit('the site references assets on the internet:\n  ' + '\n  '.join(bad[:20]))

def serve(directory: Path, port: int = 8000):
    import functools, http.server
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    with http.server.ThreadingHTTPServer(('127.0.0.1', port), handler) as httpd:
        log(f'serving {directory} on http://127.0.0.1:{port}/ (Ctrl-C to stop)')
        with contextlib.suppress(KeyboardInterrupt): httpd.serve_forever()

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', type=Path, default=HERE.parent, help='project root (settings.ini)')
    ap.add_argument('--out', type=Path, default=None, help='output folder (default: <root>/_docs); the site goes to <out>/site')
    ap.add_argument('--no-widgets', action='store_true', help='do not fetch the widget bundle: static outputs only')
    ap.add_argument('--keep-going', action='store_true', help='skip notebooks that fail to process instead of failing')
    ap.add_argument('--serve', action='store_true', help='serve the built site on http://127.0.0.1:PORT')
    ap.add_argument('--port', type=int, default=8000)
    a = ap.parse_args(argv)
    root = a.root.resolve()
    site = Site(root, (a.out or root/'_docs').resolve(), widgets=not a.no_widgets)
    out = site.build(strict_notebooks=not a.keep_going)
    print(out)
    if a.serve: serve(out, a.port)

if __name__ == '__main__': main()
