"""MkDocs hooks (see mkdocs.yml): the notebooks become pages, mkdocs-jupyter renders them, Material builds the site.

Only what the libraries do not do is here:
- `on_config`: nbdev's processing of every notebook (`nbpages.py`) into a temporary folder, the menu in the sections
  of `NAV` (the order a reader walks them), the package version in the site name;
- `on_files`: the processed notebooks and the images under nbs/ join the site's files (mkdocs-jupyter picks the
  notebooks up);
- math: mistune (through nbconvert) finds `$...$` and `$$...$$` as it parses a cell's Markdown; they are rendered
  to MathML right there (latex2mathml), so a formula stays where the parser found it and no script is needed;
- `on_page_content`: the page outline from its headings (unique ids; `show_doc` entries included), mkdocs-jupyter's
  inline CSS moved into one shared file, its MathJax loader dropped, kernel-free widgets wired to their script;
- `on_post_build`: links to `page.html#anchor` must reach an element (nbdev's bare method anchors are pointed at the
  entry; any other missing anchor fails the build), every image has alt text, and nothing may reference the internet.
"""
from __future__ import annotations

import html as _html, os, re, shutil, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path: sys.path.insert(0, str(HERE))
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))  # this checkout's package, not another installed copy

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import get_toc

import nbpages

log = lambda *a: print('[docs]', *a, file=sys.stderr, flush=True)
MEDIA = {'.png', '.jpg', '.jpeg', '.gif', '.svg', '.webp'}
# The menu: sections in the order a reader walks them, each a list of page names (nbdev's: 01_allocators.ipynb ->
# allocators; a page's label is its notebook's title). A notebook listed nowhere still gets a place: `eval_*` in the
# harness reference, anything else at the end of the library section (`nav_sections`), and the build says so.
HARNESS = 'Harness reference'
NAV = [
    ('Start', ['index', 'getting_started', 'cli', 'serve', 'distributed']),
    ('How the methods work', ['proxy', 'allocators', 'h2o', 'policies', 'cache', 'storage', 'group_storage',
                              'kivi_storage', 'choosing_storage', 'native', 'batch', 'batch_kivi', 'costs',
                              'coordinator', 'methods', 'planner']),
    ('The library', ['builder', 'blas', 'models', 'reliability', 'api']),
    ('Results', ['every_task', 'quality', 'speed', 'batch_speed']),
    (HARNESS, ['eval_prompts', 'eval_measure', 'eval_batching', 'eval_grid', 'eval_fraction', 'eval_prefill',
               'eval_results', 'eval_tables', 'eval_grid_tables', 'eval_plots', 'eval_quality_cli',
               'eval_bench', 'eval_bench_prefill', 'eval_bench_run', 'eval_default_speed', 'eval_batch_bench',
               'eval_sharding', 'eval_levers']),
    ('The explorer', ['explore_schedules']),
]
LABELS = {'index': 'Home'}   # the home page's title is the package name

def nav_sections(names):
    """The menu as (section, [page names]) in `NAV`'s order, for the pages there are (`names`, in notebook order).
    Pages `NAV` does not list are added (`eval_*` to the harness, any other to the library section) and returned as
    the second value; names `NAV` lists that are not pages are dropped."""
    have = set(names)
    sections = [(title, [n for n in pages if n in have]) for title, pages in NAV]
    listed = {n for _, pages in NAV for n in pages}
    extra = [n for n in names if n not in listed]
    for n in extra:
        dest = HARNESS if n.startswith('eval_') else 'The library'
        next(pages for title, pages in sections if title == dest).append(n)
    return [(t, ps) for t, ps in sections if ps], extra

_state = {}

# ---------------------------------------------------------------------------------------------------------------
# math: MathML where mistune finds the formula

def _mathml(tex: str, display: bool) -> str:
    from latex2mathml.converter import convert
    try: return convert(_html.unescape(tex).strip(), display='block' if display else 'inline')
    except Exception: return _html.escape(f'$${tex}$$' if display else f'${tex}$')

def _patch_math():
    from nbconvert.filters.markdown_mistune import IPythonRenderer
    IPythonRenderer.inline_math = lambda self, body: _mathml(body, False)
    IPythonRenderer.block_math = lambda self, body: f'<span class="vq-math">{_mathml(body, True)}</span>'
    def env(self, name, body):
        tex = '\\begin{' + name + '}' + body + '\\end{' + name + '}'
        return f'<span class="vq-math">{_mathml(tex, True)}</span>'
    IPythonRenderer.latex_environment = env

# ---------------------------------------------------------------------------------------------------------------

def on_config(config):
    from nbdev.config import get_config
    cfg = get_config(path=ROOT)
    import veloxquant_mlx
    config['site_name'] = f"{cfg.lib_name} {veloxquant_mlx.__version__}"
    config['site_description'] = cfg.get('description', '')
    config['copyright'] = f"Copyright {cfg.get('copyright', '')} · {cfg.lib_name} {veloxquant_mlx.__version__}"
    # mkdocs-jupyter caches each page's HTML by the notebook's content: keep that cache under _docs/ (not ./.cache of
    # whatever the cwd is), and key it by this build code too, so that a change here never serves stale pages
    import hashlib, mkdocs_jupyter
    code = hashlib.sha256(b''.join(p.read_bytes() for p in sorted(HERE.glob('*.py'))) + mkdocs_jupyter.__version__.encode())
    for name, plugin in config['plugins'].items():
        if 'jupyter' in name: plugin.config['cache_dir'] = str(ROOT/'_docs'/'.cache'/f'mkdocs-jupyter-{code.hexdigest()[:12]}')
    _patch_math()
    t0 = time.time()
    out = Path(tempfile.mkdtemp(prefix='vq-docs-'))
    pages = nbpages.build_pages(ROOT, out, log=lambda *a: None)
    by_name = {p.name: p for p in pages}
    sections, extra = nav_sections([p.name for p in pages])
    if extra: log(f'pages not in the menu sections of hooks.NAV, added by rule: {extra}')
    config['nav'] = [{title: [{LABELS.get(n, by_name[n].title): f'{n}.ipynb'} for n in names]}
                     for title, names in sections]
    _state.update(out=out, pages={p.name: p for p in pages}, nbs=Path(cfg.nbs_path), css=None)
    log(f'{len(pages)} notebooks processed in {time.time() - t0:.1f}s')
    return config

@event_priority(100)   # before mkdocs-jupyter wraps the notebooks
def on_files(files, config):
    out, nbs = _state['out'], _state['nbs']
    for name in _state['pages']:
        files.append(File(f'{name}.ipynb', str(out), config['site_dir'], config['use_directory_urls']))
    for p in sorted(nbs.rglob('*')):
        rel = p.relative_to(nbs)
        if p.is_file() and p.suffix.lower() in MEDIA and not any(s.startswith(('.', '_')) for s in rel.parts):
            if files.get_file_from_path(rel.as_posix()) is None:
                files.append(File(rel.as_posix(), str(nbs), config['site_dir'], config['use_directory_urls']))
    return files

# ---------------------------------------------------------------------------------------------------------------
# one page

_re_mathjax = re.compile(r'<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.S)
_re_style = re.compile(r'<style type="text/css">(.*?)</style>', re.S)

def _heading_name(h) -> str:
    if 'vq-doc' in (h.get('class') or []):
        code = h.find('code')
        return code.get_text() if code else h.get_text()
    parts = [t for t in h.strings if t.parent.name != 'a' or 'anchor-link' not in (t.parent.get('class') or [])]
    return ''.join(parts).strip()

def _outline(soup, depth=(2, 3, 4)):
    """Unique heading ids (a `show_doc` entry keeps nbdev's anchor, `h2ocache.trim`; a section heading of the same
    text gets a suffix) and the outline of the page (mkdocs toc tokens)."""
    heads = soup.find_all([f'h{i}' for i in (1, *depth)])
    seen = set()
    def claim(h):
        old = h.get('id')
        hid = old or re.sub(r'[^\w.-]+', '-', _heading_name(h).lower()).strip('-') or 'section'
        base, n = hid, 1
        while hid in seen: n += 1; hid = f'{base}-{n}'
        if hid != old:
            for a in h.find_all('a', href=f'#{old}'): a['href'] = f'#{hid}'
            h['id'] = hid
        seen.add(hid)
    for h in heads:
        if 'vq-doc' in (h.get('class') or []): claim(h)
    for h in heads:
        if 'vq-doc' not in (h.get('class') or []): claim(h)
    tokens, stack = [], []
    for h in heads:
        level = int(h.name[1])
        tok = dict(level=level, id=h['id'], name=_html.escape(_heading_name(h)), children=[])
        while stack and stack[-1]['level'] >= level: stack.pop()
        (stack[-1]['children'] if stack else tokens).append(tok)
        stack.append(tok)
    return tokens

def on_page_content(html, page, config, files):
    name = Path(page.file.src_uri).stem
    if name not in _state.get('pages', {}): return html
    from bs4 import BeautifulSoup
    html = _re_mathjax.sub('', html)
    css = _re_style.findall(html)
    if css and _state['css'] is None: _state['css'] = '\n'.join(css)
    html = _re_style.sub('', html)
    soup = BeautifulSoup(html, 'html.parser')
    page.toc = get_toc(_outline(soup))
    for w in sorted(_state['pages'][name].widgets):
        soup.append(BeautifulSoup(f'<script src="assets/widgets/{w}.js"></script>', 'html.parser'))
    return str(soup)

def on_post_build(config):
    site = Path(config['site_dir'])
    if _state.get('css'):
        (site/'assets'/'jupyter').mkdir(parents=True, exist_ok=True)
        (site/'assets'/'jupyter'/'notebook.css').write_text(_state['css'].replace('.highlight ', '.highlight-ipynb '))
    fix_anchors(site)
    check_offline(site)
    check_alt_text(site)
    shutil.rmtree(_state.get('out', ''), ignore_errors=True)

# ---------------------------------------------------------------------------------------------------------------
# the whole site

_re_id = re.compile(r'\sid="([^"]+)"')
_re_href = re.compile(r'href="([\w./-]+\.html)#([^"]+)"')

def fix_anchors(site: Path):
    """Every `page.html#anchor` link must reach an element of that page. nbdev's module index names a method by its bare
    name (`#trim`): such a link is pointed at the page's one entry that ends with it (`#h2ocache.trim`), and a name
    documented only on the API page at that entry. Anything else (a member entry that does not exist above all) fails
    the build with the list, instead of quietly becoming a link to the top of the page."""
    ids = {p.relative_to(site).as_posix(): set(_re_id.findall(p.read_text())) for p in site.rglob('*.html')}
    broken = []
    def fix(src, m):
        target = os.path.normpath(os.path.join(os.path.dirname(src), m.group(1))).replace(os.sep, '/')
        frag = m.group(2)
        have = ids.get(target)
        if have is None or frag in have: return m.group(0)
        ends = [i for i in have if i.endswith('.' + frag)]
        if '.' not in frag and len(ends) == 1: return f'href="{m.group(1)}#{ends[0]}"'
        if '.' not in frag and frag in ids.get('api.html', ()): return f'href="{os.path.relpath("api.html", os.path.dirname(src) or ".")}#{frag}"'
        broken.append(f'{src}: {m.group(1)}#{frag}')
        return m.group(0)
    for rel in ids:
        p = site/rel
        text = p.read_text()
        new = _re_href.sub(lambda m: fix(rel, m), text)
        if new != text: p.write_text(new)
    if broken:
        broken = sorted(set(broken))
        raise SystemExit(f'{len(broken)} links to an anchor that does not exist (a member without its entry?):\n  '
                         + '\n  '.join(broken[:60]))

def check_alt_text(site: Path):
    "Every image on a page says what it shows: an `alt` that is not empty nor nbconvert's placeholder."
    bad = []
    for f in site.glob('*.html'):
        for tag in re.findall(r'<img\b[^>]*>', f.read_text()):
            alt = re.search(r'\salt="([^"]*)"', tag)
            if not alt or not alt.group(1).strip() or alt.group(1).startswith('No description has been provided'):
                bad.append(f'{f.name}: {tag[:100]}')
    if bad: raise SystemExit('images without alt text (Markdown: ![what it shows](file); a cell: `#| fig-alt: ...`):\n  '
                             + '\n  '.join(bad[:20]))

def check_offline(site: Path):
    "Nothing the browser loads may come from the internet (links to other sites are fine)."
    bad = []
    for f in site.rglob('*.html'):
        for m in re.finditer(r'<(?:script|img|link|iframe|source|video|audio)\b[^>]*?\b(?:src|href)="(?:https?:)?//[^"]+"', f.read_text()):
            tag = m.group(0)
            if tag.startswith('<link') and not re.search(r'rel="(stylesheet|preload|icon|modulepreload|preconnect)', tag): continue
            bad.append(f'{f.relative_to(site)}: {tag[:120]}')
    if bad: raise SystemExit('the site references assets on the internet:\n  ' + '\n  '.join(bad[:20]))
