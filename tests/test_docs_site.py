"""The docs site, built offline from the notebooks (`mkdocs build`) and read in a real browser (headless Chromium).
The checks of the built files and of the README need no browser and run without Chromium; the others are skipped
there, saying so.

The site is built once into a temporary folder and served on 127.0.0.1. The tests fail on:
- a console error or uncaught exception, a same-origin request that fails, an image that does not load, any request
  to another host, an internal link or #anchor that leads nowhere, search that finds nothing;
- a repr instead of documentation (`object at 0x`, "Call self as a function."), a duplicate id on a page;
- methods, properties and classmethods not rendered as `Class.member` entries; [source] links that miss their line;
- inline math that leaves its paragraph (the PyramidKV worked example must read as one paragraph);
- anything wider than the text column at 1400 px (code wraps, tables fit), a text column narrower than 800 px;
- a name of `veloxquant_mlx.__all__` without its entry on the API page; no version; no Getting started entry;
- the home page's quality figures disagreeing with the quality page's;
- the schedule explorer's plot not following its sliders, or computing other budgets than the Python.

`VQ_DOCS_SITE=/path/to/site pytest tests/test_docs_site.py` runs the same checks on a site built elsewhere (that is how
the checks were shown to fail on the site of the previous builder). Screenshots go to `_docs/screenshots/`.
"""
import functools, http.server, json, os, random, re, shutil, subprocess, sys, threading, time, urllib.error, urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urlsplit, unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get('CHROMIUM') or shutil.which('chromium') or '/usr/bin/chromium'
SHOTS = ROOT/'_docs'/'screenshots'
LOCAL_HOSTS = {'127.0.0.1', 'localhost'}
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
                 '--disable-component-update', '--disable-sync', '--disable-default-apps']
WIDE = {'width': 1400, 'height': 900}
# the pages that hold wide things: tables, long code, signatures with parameter comments, the widget
WIDE_PAGES = ['index.html', 'allocators.html', 'h2o.html', 'cache.html', 'builder.html', 'api.html', 'quality.html', 'speed.html',
              'explore_schedules.html', 'reliability.html']

# the browser is needed per test (through the `browser` fixture), not for the module: the checks of the built files run
# without it
NO_BROWSER = 'the docs pages are not looked at in a browser'

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "Build the site once (`mkdocs build`), serve it on a free localhost port."
    given = os.environ.get('VQ_DOCS_SITE')
    if given: site_dir, log = Path(given), ''
    else:
        out = tmp_path_factory.mktemp('docs')
        site_dir = out/'site'
        t0 = time.time()
        r = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '-q', '-f', str(ROOT/'mkdocs.yml'), '-d', str(site_dir)],
                           cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, 'NO_MKDOCS_2_WARNING': '1'})
        assert r.returncode == 0, f'docs build failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}'
        print(f'docs build: {time.time() - t0:.1f}s')
        log = r.stderr
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_Quiet, directory=str(site_dir)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield site_dir, f'http://127.0.0.1:{httpd.server_address[1]}/', log
    httpd.shutdown(); httpd.server_close()

@pytest.fixture(scope='module')
def browser():
    "Headless Chromium (from the OS) driven by playwright; the test is skipped, saying so, where either is missing."
    if not Path(CHROMIUM).exists():
        pytest.skip(f'needs Chromium from the OS at {CHROMIUM} (apt-get install chromium, or CHROMIUM=/path; .ci/run '
                    f'installs it): {NO_BROWSER}')
    pw = pytest.importorskip('playwright.sync_api',
                             reason=f'needs playwright (a dev requirement: pip install -e ".[dev]"): {NO_BROWSER}')
    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()

def _block_internet(ctx, external):
    def route(r):
        u = urlsplit(r.request.url)
        if u.scheme in ('data', 'blob') or u.hostname in LOCAL_HOSTS: return r.continue_()
        external.add(r.request.url); r.abort()
    ctx.route('**/*', route)

@pytest.fixture
def page(browser):
    "A 1400 px wide page that cannot reach the internet."
    ctx = browser.new_context(viewport=WIDE, service_workers='block')
    external = set()
    _block_internet(ctx, external)
    pg = ctx.new_page()
    yield pg
    ctx.close()
    assert not external, f'requests to the internet: {sorted(external)}'

def pages_of(site_dir):
    return sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob('*.html') if p.name != '404.html')

def notebook_pages():
    "The page every notebook under nbs/ becomes (nbdev's names)."
    sys.path.insert(0, str(ROOT/'scripts'/'docs'))
    from nbpages import find_notebooks, page_name
    nbs = ROOT/'nbs'
    return [page_name(p.relative_to(nbs)) + '.html' for p in find_notebooks(nbs)]

# ----------------------------------------------------------------------------------------------------------------
# every page

def test_site_has_every_notebook_version_and_getting_started(site):
    site_dir, _, _ = site
    have = set(pages_of(site_dir))
    want = notebook_pages()
    assert set(want) <= have, f'notebook pages missing: {sorted(set(want) - have)}'
    home = (site_dir/'index.html').read_text()
    import veloxquant_mlx
    assert re.search(rf'veloxquant_mlx\s+{re.escape(veloxquant_mlx.__version__)}', home), 'the package version is not shown'
    nav = [link for _, links in menu(home) for link in links]
    labels = [t for _, t in nav]
    assert 'Getting started' in labels[:3], f'no "Getting started" near the top of the menu: {labels}'
    for w in want: assert any(h == w for h, _ in nav), f'{w} not in the menu'

# The menu's sections, in the order a reader walks them: what to start with, how the methods work, the library around
# them, what they measured, the harness that measured it, the explorer. (scripts/docs/hooks.py, NAV, makes them.)
SECTIONS = ['Start', 'How the methods work', 'The library', 'Results', 'Harness reference', 'The explorer']
SECTION_PAGES = {   # pages each section must hold, in this order (a section may hold more, after the harness rule)
    'Start': ['index.html', 'getting_started.html', 'cli.html', 'serve.html', 'distributed.html'],
    'How the methods work': ['proxy.html', 'allocators.html', 'h2o.html', 'policies.html', 'cache.html', 'storage.html',
                             'group_storage.html', 'kivi_storage.html', 'choosing_storage.html',
                             'batch.html', 'costs.html', 'coordinator.html', 'methods.html', 'planner.html'],
    'The library': ['builder.html', 'blas.html', 'models.html', 'reliability.html', 'api.html'],
    'Results': ['every_task.html', 'quality.html', 'speed.html', 'batch_speed.html'],
    'The explorer': ['explore_schedules.html'],
}

def menu(html: str) -> list:
    "The site's menu (Material's primary navigation) as [(section, [(href, label), ...]), ...], top-level in order."
    from bs4 import BeautifulSoup
    nav = BeautifulSoup(html, 'html.parser').select_one('nav.md-nav--primary')
    assert nav is not None, 'no primary navigation on the page'
    out = []
    for li in nav.find('ul', class_='md-nav__list').find_all('li', recursive=False):
        head = li.find(['label', 'a'], class_='md-nav__link', recursive=False)
        sub = li.find('nav', class_='md-nav', recursive=False)
        items = sub.find('ul', class_='md-nav__list').find_all('li', recursive=False) if sub else [li]
        links = [(a['href'], a.get_text(' ', strip=True)) for it in items
                 for a in it.find_all('a', class_='md-nav__link', href=True, recursive=False) if '#' not in a['href']]
        out.append((head.get_text(' ', strip=True) if sub else None, links))
    return out

def test_menu_sections_in_reading_order(site):
    "The menu is in sections, in reading order; every notebook is in it once, the harness's pages in their own section."
    site_dir, _, _ = site
    want = notebook_pages()
    home = menu((site_dir/'index.html').read_text())
    assert [t for t, _ in home] == SECTIONS, f'menu sections {[t for t, _ in home]}, expected {SECTIONS}'
    hrefs = {t: [h for h, _ in links] for t, links in home}
    for title, pages in SECTION_PAGES.items():
        have = [h for h in hrefs[title] if h in pages]
        assert have == pages, f'section {title!r}: {hrefs[title]}, expected {pages} in this order'
    assert hrefs['Start'][0] == 'index.html' and home[0][1][0][1] == 'Home', 'the menu does not start at Home'
    harness = [w for w in want if w.startswith('eval_')]
    assert sorted(hrefs['Harness reference']) == sorted(harness), \
        f'the harness reference holds {hrefs["Harness reference"]}, expected every eval_ page: {harness}'
    assert all(not h.startswith('eval_') for t, hs in hrefs.items() if t != 'Harness reference' for h in hs), hrefs
    every = [h for hs in hrefs.values() for h in hs]
    twice = sorted({h for h in every if every.count(h) > 1})
    assert sorted(every) == sorted(want), (f'the menu and the notebooks differ: not in the menu {sorted(set(want) - set(every))}, '
                                           f'not a notebook {sorted(set(every) - set(want))}, twice {twice}')
    for rel in ('eval_plots.html', 'explore_schedules.html', 'allocators.html'):   # every page shows the same menu
        assert menu((site_dir/rel).read_text()) == home, f'{rel} shows another menu than the home page'

def test_no_internet_assets_in_files(site):
    site_dir, _, _ = site
    bad = []
    for f in site_dir.rglob('*'):
        if f.suffix not in ('.html', '.css', '.js') or 'search' in f.parts: continue
        text = f.read_text(errors='replace')
        bad += [f'{f.name}: {m}' for m in re.findall(r'(?:src=|@import\s+|url\()\s*["\']?(?:https?:)?//[^"\')\s]+', text)]
        bad += [f'{f.name}: {m}' for m in re.findall(r'<link\b[^>]*rel="(?:stylesheet|preload|preconnect|icon)"[^>]*href="(?:https?:)?//[^"]+"', text)]
    assert not bad, 'assets from the internet:\n' + '\n'.join(bad[:20])

_WIDTH_JS = '''() => {
    const col = document.querySelector('.md-content__inner').getBoundingClientRect();
    const out = [];
    for (const e of document.querySelectorAll('.md-content__inner *')) {
        const b = e.getBoundingClientRect();
        if (!b.width || getComputedStyle(e).visibility === 'hidden') continue;
        if (b.right > col.right + 1) out.push(`${e.tagName}.${e.className} right=${Math.round(b.right)} > ${Math.round(col.right)}: ${(e.innerText || '').slice(0, 60)}`);
        else if (e.scrollWidth > e.clientWidth + 1 && ['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowX))
            out.push(`${e.tagName}.${e.className} hides ${e.scrollWidth - e.clientWidth}px behind a scroll bar: ${(e.innerText || '').slice(0, 60)}`);
    }
    return {width: col.width, out: out.slice(0, 8)}; }'''

@pytest.fixture(scope='module')
def crawl(site, browser):
    """Every page read once at 1400 px: what went wrong while loading, its ids, text, links, and (for the pages with
    wide content) what sticks out of the text column. The tests below judge it."""
    site_dir, base, _ = site
    res = {'problems': [], 'external': set(), 'pages': {}, 'links': {}}
    current = {'page': None}
    def note(kind, msg): res['problems'].append(f'[{current["page"]}] {kind}: {msg}')
    ctx = browser.new_context(viewport=WIDE, service_workers='block')
    _block_internet(ctx, res['external'])
    pg = ctx.new_page()
    pg.on('console', lambda m: m.type == 'error' and note('console error', m.text))
    pg.on('pageerror', lambda e: note('uncaught exception', str(e)))
    # the browser fetches the favicon on its own after a page loads; the next page's navigation can cut that fetch off
    # (net::ERR_ABORTED, seen on a loaded machine): not a broken asset (a missing file still answers HTTP 404, below)
    lazy = lambda r: r.failure == 'net::ERR_ABORTED' and urlsplit(r.url).path.endswith('/favicon.png')
    pg.on('requestfailed', lambda r: urlsplit(r.url).hostname in LOCAL_HOSTS and not lazy(r)
          and note('request failed', f'{r.url} {r.failure}'))
    pg.on('response', lambda r: urlsplit(r.url).hostname in LOCAL_HOSTS and not (200 <= r.status < 400) and note(f'HTTP {r.status}', r.url))
    for rel in pages_of(site_dir):
        current['page'] = rel
        pg.goto(base + rel, wait_until='networkidle')
        for b in pg.evaluate('() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.currentSrc || i.src)'):
            note('image not shown', b)
        n = pg.locator('.vq-widget').count()
        if n and pg.locator('.vq-widget svg, .vq-widget .vq-error').count() < n: note('widget', 'a kernel-free widget did not render')
        info = pg.evaluate('''() => { const c = {}; document.querySelectorAll('[id]').forEach(e => c[e.id] = (c[e.id] || 0) + 1);
            const art = document.querySelector('article');
            return {ids: Array.from(document.querySelectorAll('[id], a[name]')).map(e => e.id || e.getAttribute('name')),
                    dups: Object.entries(c).filter(([k, n]) => n > 1).map(([k, n]) => `${k} x${n}`),
                    text: art ? art.innerText : document.body.innerText,
                    prose: Array.from(document.querySelectorAll('article .jp-RenderedMarkdown')).filter(m => !m.querySelector('.vq-doc'))
                                .map(m => m.innerText).join(String.fromCharCode(10)),
                    entries: Array.from(document.querySelectorAll('.vq-doc')).map(h => h.id),
                    members: Array.from(document.querySelectorAll('article p')).filter(p => p.innerText.trim().startsWith('Members:'))
                                  .flatMap(p => Array.from(p.querySelectorAll('a')).map(a => a.href)),
                    imgs: Array.from(document.querySelectorAll('article img')).map(i => ({src: i.getAttribute('src'), alt: i.getAttribute('alt'),
                                  natural: i.naturalWidth, shown: i.getBoundingClientRect().width})),
                    tex: Array.from(document.querySelectorAll('article math')).map(m => m.textContent).filter(t => t.includes(String.fromCharCode(92))),
                    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href)}; }''')
        info['wide'] = pg.evaluate(_WIDTH_JS) if rel in WIDE_PAGES else None
        for href in info.pop('links'):
            if urlsplit(href).hostname in LOCAL_HOSTS: res['links'].setdefault(href, set()).add(rel)
        res['pages'][rel] = info
        if rel in ('index.html', 'explore_schedules.html', 'getting_started.html', 'cli.html', 'quality.html', 'api.html'):
            SHOTS.mkdir(parents=True, exist_ok=True)   # the long pages: their first screen
            pg.screenshot(path=str(SHOTS/rel.replace('.html', '.png')), full_page=rel in ('index.html', 'explore_schedules.html'))
    current['page'] = 'search'   # Material's offline lunr index finds a page by a word of its title
    pg.goto(base + 'index.html', wait_until='networkidle')
    box = pg.locator('input.md-search__input')
    box.click(); box.press_sequentially('allocators', delay=20)
    try: pg.wait_for_selector('.md-search-result__item', timeout=15000)
    except Exception: note('search', 'no result for "allocators"')
    ctx.close()
    return res

def test_every_page_in_chromium(crawl):
    "No console error, failed request, broken image, broken link or anchor; search works; widgets render."
    problems = list(crawl['problems'])
    ids = {rel: set(p['ids']) for rel, p in crawl['pages'].items()}
    for href, where in sorted(crawl['links'].items()):
        url, frag = urldefrag(href)
        path = unquote(urlsplit(url).path).lstrip('/') or 'index.html'
        if path.endswith('/'): path += 'index.html'
        if path in ids:
            if frag and unquote(frag) not in ids[path]: problems.append(f'[{sorted(where)[0]}] broken anchor: {href}')
            continue
        try:
            with urllib.request.urlopen(url, timeout=10) as r: ok = 200 <= r.status < 300
        except urllib.error.HTTPError: ok = False
        if not ok: problems.append(f'[{sorted(where)[0]}] broken link: {href}')
    assert not crawl['external'], 'requests to the internet:\n' + '\n'.join(sorted(crawl['external']))
    assert not problems, f'{len(problems)} problems on {len(ids)} pages:\n' + '\n'.join(problems[:50])

def test_no_reprs_and_no_duplicate_ids(crawl):
    "No memory addresses, no `__call__` docstring, no repr of a descriptor; every id once per page."
    problems = []
    for rel, p in crawl['pages'].items():
        text = p['text']
        for bad in ('object at 0x', 'Call self as a function.', '<classmethod(', '<property object', '<function '):
            if bad in text: problems.append(f'{rel}: shows {bad!r} ({text[max(0, text.find(bad) - 80):text.find(bad) + 40]!r})')
        if p['dups']: problems.append(f'{rel}: duplicate ids {p["dups"][:10]}')
    assert not problems, '\n'.join(problems)

def test_nothing_wider_than_the_text_column(crawl):
    "At 1400 px: a text column of at least 800 px, and nothing in it wider than it or hidden behind a scroll bar."
    problems = []
    for rel in WIDE_PAGES:
        r = crawl['pages'][rel]['wide']
        if r['width'] < 800: problems.append(f'{rel}: the text column is {r["width"]:.0f}px wide at 1400 px')
        problems += [f'{rel}: {x}' for x in r['out']]
    assert not problems, '\n'.join(problems)

# ----------------------------------------------------------------------------------------------------------------
# API entries

def _entries(page, base, rel):
    page.goto(base + rel, wait_until='domcontentloaded')
    return page.evaluate('''() => Array.from(document.querySelectorAll('.vq-doc')).map(h => {
        let doc = '', el = h.nextElementSibling;
        while (el && !/^H[1-4]$/.test(el.tagName)) { doc += ' ' + el.innerText; el = el.nextElementSibling; }
        return {id: h.id, name: (h.querySelector('code') || h).innerText, kind: (h.querySelector('.vq-kind') || {}).innerText || '',
                source: (h.querySelector('.vq-source') || {}).href || '', doc: doc.trim()}; })''')

def test_api_page_documents_every_exported_name(site, page):
    import veloxquant_mlx
    _, base, _ = site
    entries = {e['id']: e for e in _entries(page, base, 'api.html')}
    missing = [n for n in veloxquant_mlx.__all__ if n.lower() not in entries]
    assert not missing, f'names of veloxquant_mlx.__all__ without an entry on the API page: {missing}'
    for n in veloxquant_mlx.__all__:
        e = entries[n.lower()]
        assert e['name'] == n and len(e['doc']) > 20, f'{n}: entry without its documentation: {e}'

def test_methods_render_as_members_of_their_class(site, page):
    _, base, _ = site
    entries = _entries(page, base, 'cache.html')
    names = [e['name'] for e in entries]
    kinds = {e['name']: e['kind'] for e in entries}
    for want, kind in [('EvictingCache.update_and_fetch', ''), ('EvictingCache.state', 'property'),
                       ('EvictingCache.trim', ''), ('EvictingCache.nbytes', 'property')]:
        assert want in names, f'{want} is not an entry of the cache page: {names}'
        assert kinds[want] == kind, f'{want}: kind {kinds[want]!r}, expected {kind!r}'
    for e in entries:
        if e['name'] in ('update_and_fetch', 'state', 'trim'): pytest.fail(f'{e["name"]} rendered as a free function')
    batch = {e['name']: e['kind'] for e in _entries(page, base, 'batch.html')}   # the batch module adds `merge`
    assert batch.get('EvictingCache.merge') == 'classmethod', f'EvictingCache.merge on the batch page: {batch}'

def test_source_links_point_at_the_definition(site, page):
    "[source] goes to settings.ini's git_url, file and line, and that line defines the symbol."
    from configparser import ConfigParser
    cfg = ConfigParser(); cfg.read(ROOT/'settings.ini')
    git_url = cfg['DEFAULT']['git_url'].rstrip('/')
    _, base, _ = site
    checked = 0
    for rel in ('cache.html', 'allocators.html', 'api.html'):
        for e in _entries(page, base, rel):
            m = re.match(rf'{re.escape(git_url)}/blob/[\w.-]+/(.+)#L(\d+)$', e['source'])
            assert m, f'{rel}: {e["name"]} has no [source] link to {git_url} with a line: {e["source"]!r}'
            lines = (ROOT/m.group(1)).read_text().splitlines()
            short = e['name'].rsplit('.', 1)[-1]
            near = '\n'.join(lines[int(m.group(2)) - 1:int(m.group(2)) + 3])
            assert re.search(rf'(def|class)\s+{re.escape(short)}\b', near), f'{e["name"]}: line {m.group(2)} of {m.group(1)} is {near!r}'
            checked += 1
    assert checked > 30

# ----------------------------------------------------------------------------------------------------------------
# math, layout

def test_inline_math_stays_in_its_paragraph(site, page):
    _, base, _ = site
    for rel in ('allocators.html', 'h2o.html'):
        page.goto(base + rel, wait_until='domcontentloaded')
        r = page.evaluate('''() => ({
            inline: Array.from(document.querySelectorAll('article math:not([display=block])')).map(m => {
                const p = m.closest('p, li, td, th, h1, h2, h3, h4, figcaption');
                return p ? p.innerText.trim().length > m.textContent.trim().length + 3 : false; }),
            broken: Array.from(document.querySelectorAll('article p')).map(p => p.innerText.trim())
                         .filter(t => /^[;.,)]/.test(t)).slice(0, 5),
            raw: (document.querySelector('article').innerText.match(/\\$[^$\\n]{1,40}\\$/g) || []).slice(0, 5) })''')
        assert r['inline'] and all(r['inline']), f'{rel}: an inline formula is a block of its own'
        assert not r['broken'], f'{rel}: paragraphs that start mid-sentence (a formula broke them): {r["broken"]}'
        assert not r['raw'], f'{rel}: formulas left as TeX: {r["raw"]}'
    page.goto(base + 'allocators.html', wait_until='domcontentloaded')
    ok = page.evaluate('''() => Array.from(document.querySelectorAll('article p')).some(p =>
        p.innerText.includes('Reading the example backwards') && p.innerText.includes('the steps are') &&
        p.innerText.includes('gives the list exactly'))''')
    assert ok, 'the PyramidKV worked example does not read as one paragraph'

# ----------------------------------------------------------------------------------------------------------------
# the home page and the quality page

def _tables(page):
    return page.evaluate('''() => Array.from(document.querySelectorAll('article table')).map(t =>
        Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.innerText.trim())))''')

def test_home_quality_figures_equal_the_quality_page(site, page):
    "The home page's results table and headline are the quality page's, row for row (one function, one JSON)."
    _, base, _ = site
    page.goto(base + 'index.html', wait_until='domcontentloaded')
    home_text, home_tables = page.evaluate('() => document.querySelector("article").innerText'), _tables(page)
    links_quality = page.locator('article a[href="quality.html"]').count()
    page.goto(base + 'quality.html', wait_until='domcontentloaded')
    q_text, q_tables = page.evaluate('() => document.querySelector("article").innerText'), _tables(page)
    head = next((t for t in home_tables if t[0][0] == 'row' and any('@' in h for h in t[0][1:])), None)
    assert head, 'no results table (row | length @ share ...) on the home page'
    full = next((t for t in q_tables if t[0] == head[0]), None)
    assert full, 'the quality page has no results table with the same columns as the home page'
    qrows = {r[0]: r for r in full[1:]}
    for r in head[1:]:
        assert r[0] in qrows, f'home page row {r[0]!r} is not a row of the quality page'
        assert r == qrows[r[0]], f'{r[0]}: home {r}, quality page {qrows[r[0]]}'
    assert len(head) >= 5, 'the home page shows too few rows'
    m = re.search(r'it retrieves (\d+)/(\d+) of the keys', home_text)
    assert m and m.group(0) in q_text, 'the headline sentence of the home page is not on the quality page'
    assert links_quality, 'the home page does not link the quality page'

def test_readme_and_index_show_the_current_results():
    "README.md and the saved output of nbs/index.ipynb carry what the quality functions make of the results JSON now."
    from veloxquant_mlx.eval.results import load_fraction_results, HEADLINE_ROWS, FRACTION_RESULTS
    from veloxquant_mlx.eval.tables import fraction_headline, fraction_table
    res = load_fraction_results(*[str(ROOT/'nbs'/p) for p in FRACTION_RESULTS])
    want = fraction_headline(res, HEADLINE_ROWS[0]) + "\n\n" + fraction_table(res, HEADLINE_ROWS)
    fix = 'run `python scripts/run_nb.py nbs/index.ipynb && python scripts/render_readme.py`'
    assert want in (ROOT/'README.md').read_text(), f'README.md does not show the current quality results: {fix}'
    nb = json.loads((ROOT/'nbs'/'index.ipynb').read_text())
    outs = [''.join(o.get('data', {}).get('text/markdown', '')) for c in nb['cells'] if c['cell_type'] == 'code' for o in c.get('outputs', [])]
    assert want in outs, f'nbs/index.ipynb carries an old quality summary: {fix}'

def _run_cell(src:str, ns:dict):
    "Execute a cell's source in `ns`; the value of its last expression (what the notebook shows), or None."
    import ast
    tree = ast.parse(src)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, '<cell>', 'exec'), ns)
    return None if last is None else eval(compile(ast.Expression(last.value), '<cell>', 'eval'), ns)

def test_every_computed_readme_section_is_current():
    """Every computed (`exec_doc`) cell of nbs/index.ipynb, run now on the result files, gives the output saved in the
    notebook, and README.md carries it: the every-task tables of both models, the speed line, the fraction section and
    the methods table cannot drift from their JSON (the docs pages run the same cells when they are built)."""
    nb = json.loads((ROOT/'nbs'/'index.ipynb').read_text())
    readme = (ROOT/'README.md').read_text()
    fix = 'run `python scripts/run_nb.py nbs/index.ipynb && python scripts/render_readme.py`'
    cwd, ns, checked = os.getcwd(), {}, 0
    os.chdir(ROOT/'nbs')
    try:
        for c in nb['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] != 'code' or '#| exec_doc' not in src: continue
            now = _run_cell(src, ns).data
            saved = [''.join(o.get('data', {}).get('text/markdown', '')) for o in c.get('outputs', [])]
            assert now in saved, f'nbs/index.ipynb shows an old output of:\n{src[:300]}\n{fix}'
            assert now.strip() in readme, f'README.md does not show the current output of:\n{src[:300]}\n{fix}'
            checked += 1
    finally: os.chdir(cwd)
    assert checked >= 4, checked                  # methods, every task (two models), fractions, speed

# ----------------------------------------------------------------------------------------------------------------
# the schedule explorer

def _explorer_state(page):
    return page.evaluate('''() => { const s = document.querySelector('.vq-widget svg');
        return {svg: s ? s.outerHTML : null, bars: s ? Array.from(s.querySelectorAll('g')[0].querySelectorAll('rect[data-budget]')).map(r => +r.dataset.budget) : []}; }''')

def _set(page, name, value):
    page.evaluate('([n, v]) => { const e = document.querySelector(`.vq-widget [data-param="${n}"]`); e.value = v; e.dispatchEvent(new Event("input", {bubbles: true})); }', [name, value])

def test_explorer_slider_redraws_the_plot(site, page):
    from veloxquant_mlx.allocators import pyramid_budgets, squeeze_budgets
    _, base, _ = site
    page.goto(base + 'explore_schedules.html', wait_until='networkidle')
    page.wait_for_selector('.vq-widget svg', timeout=10000)
    before = _explorer_state(page)
    assert before['bars'] == pyramid_budgets(24, 256, 4, 2.0)
    page.locator('.vq-widget [data-param="beta"]').focus()
    page.keyboard.press('ArrowRight'); page.keyboard.press('ArrowRight')   # a user moving the slider: beta 2.0 -> 2.2
    after = _explorer_state(page)
    assert after['svg'] != before['svg'], 'moving the beta slider does not change the plot'
    assert after['bars'] == pyramid_budgets(24, 256, 4, 2.2)
    _set(page, 'n_layers', '12'); _set(page, 'avg_budget', '512'); _set(page, 'beta', '2')
    assert _explorer_state(page)['bars'] == [1019, 927, 835, 742, 650, 558, 466, 374, 282, 189, 97, 5]
    _set(page, 'avg_budget', '3')   # below the floor: the library's own message, as in the notebook
    assert page.locator('.vq-widget .vq-error').inner_text() == 'ValueError: `avg_budget` must be an integer >= 5, got 3'

def _notebook_ns(upto: str):
    "Run nbs/10_explore_schedules.ipynb's code cells up to (and with) the one containing `upto`; its namespace."
    nb = json.loads((ROOT/'nbs'/'10_explore_schedules.ipynb').read_text())
    ns, cwd = {}, os.getcwd()
    try:
        for c in nb['cells']:
            if c['cell_type'] != 'code': continue
            src = ''.join(c['source'])
            exec(compile('\n'.join(l for l in src.splitlines() if not l.startswith('#|')), '<nb10>', 'exec'), ns)
            if upto in src: return ns
    finally: os.chdir(cwd)
    raise KeyError(upto)

@pytest.fixture(scope='module')
def schedules_js(browser):
    "A blank page with the explorer's script loaded (its functions are `window.VQSchedules`)."
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.set_content('<html><body></body></html>')
    pg.add_script_tag(path=str(ROOT/'docs'/'assets'/'widgets'/'explore_schedules.js'))
    yield pg
    ctx.close()

def _js(pg, fn, *args):
    return pg.evaluate('''([fn, args]) => { try { return {ok: window.VQSchedules[fn](...args)}; }
                                           catch (e) { return {err: `${e.name}: ${e.message}`}; } }''', [fn, list(args)])

def _py(f, *args):
    try: return {'ok': f(*args)}
    except ValueError as e: return {'err': f'ValueError: {e}'}

def test_explorer_js_computes_what_the_python_computes(schedules_js):
    "The JavaScript port gives the same integers as the package on random settings (and the same errors)."
    from veloxquant_mlx.allocators import allocate_exact, pyramid_budgets, squeeze_budgets
    rng = random.Random(0)
    cases = 0
    for _ in range(250):
        n, sink = rng.randint(0, 64), rng.randint(0, 32)
        avg = rng.choice([rng.randint(1, 2048), rng.randint(max(1, sink - 2), sink + 8)])
        beta = rng.choice([round(rng.uniform(1, 5), 1), rng.uniform(1, 6), 1.0, 2.0])
        assert _js(schedules_js, 'pyramidBudgets', n, avg, sink, beta) == _py(pyramid_budgets, n, avg, sink, beta), (n, avg, sink, beta)
        conc = [rng.choice([rng.random(), round(rng.random(), 3), -rng.random(), 1 + rng.random(), 0.5]) for _ in range(n)]
        strength = rng.choice([round(rng.uniform(0, 1), 2), rng.random(), 0.0, 1.0])
        assert _js(schedules_js, 'squeezeBudgets', conc, avg, sink, strength) == _py(squeeze_budgets, conc, avg, sink, strength), \
            (conc, avg, sink, strength)
        w = [rng.choice([0, rng.random(), rng.randint(0, 9)]) for _ in range(rng.randint(1, 12))]
        floor = rng.randint(0, 6)
        caps = [rng.choice([None, rng.randint(floor, floor + 40)]) for _ in w] if rng.random() < 0.6 else None
        total = rng.randint(floor * len(w), floor * len(w) + 200)
        assert _js(schedules_js, 'allocateExact', w, total, floor, caps) == _py(allocate_exact, w, total, floor, caps), (w, total, floor, caps)
        cases += 3
    assert cases == 750

def test_explorer_js_profiles_and_controls_are_the_notebooks(schedules_js):
    "The page's concentration profiles and sliders are the notebook's (`concentration_profile`, the `interactive`)."
    ns = _notebook_ns('def concentration_profile')
    for name in ('flat', 'rising with depth', 'random'):
        for n in (1, 2, 7, 24, 64):
            for seed in (0, 1, 17, 99):
                assert _js(schedules_js, 'concentrationProfile', name, n, seed)['ok'] == ns['concentration_profile'](name, n, seed), (name, n, seed)
    ns = _notebook_ns('explorer = widgets.interactive(')
    want = []
    for w in ns['explorer'].kwargs_widgets:
        d = {'name': w._kwarg, 'description': w.description, 'value': w.value}
        if hasattr(w, 'options'): d['options'] = list(w.options)
        else: d.update(min=w.min, max=w.max, step=w.step)
        want.append(d)
    have = schedules_js.evaluate('() => window.VQSchedules.CONTROLS')
    have = [{k: v for k, v in c.items() if k != 'kind'} for c in have]
    assert have == want, f'the page\'s sliders differ from the notebook\'s:\n{have}\n{want}'

# ----------------------------------------------------------------------------------------------------------------
# what a reader looks for: member entries, alt text, readable figures, no tracker numbers, real outputs

def _resolve(href):
    url, frag = urldefrag(href)
    return (unquote(urlsplit(url).path).lstrip('/') or 'index.html'), unquote(frag)

def test_every_member_link_reaches_an_entry(crawl):
    "Each member a class entry lists links to that member's own entry (signature, docstring, parameters), not a page top."
    entries = {rel: set(p['entries']) for rel, p in crawl['pages'].items()}
    links = {h for p in crawl['pages'].values() for h in p['members']}
    bad = sorted(h for h in links if not (lambda t: t[1] and t[1] in entries.get(t[0], ()))(_resolve(h)))
    print(f'member entries: {len(links) - len(bad)}/{len(links)} distinct member links reach an entry')
    assert len(links) > 100, f'only {len(links)} member links: the class entries lost their member lists?'
    assert not bad, f'{len(bad)} of {len(links)} member links reach no entry:\n' + '\n'.join(bad[:40])

def test_every_image_says_what_it_shows(crawl):
    bad = [f'{rel}: {i["src"][:60]!r} alt={i["alt"]!r}' for rel, p in crawl['pages'].items() for i in p['imgs']
           if not (i['alt'] or '').strip() or i['alt'].startswith('No description has been provided')]
    assert not bad, 'images without alt text:\n' + '\n'.join(bad)

def _glyph_heights(png: bytes, dark=90):
    "Heights (px) of the small near-black connected shapes of an image: the glyphs of its text."
    import io
    import numpy as np
    from PIL import Image
    a = np.asarray(Image.open(io.BytesIO(png)).convert('RGB')).max(axis=2) < dark
    h, w = a.shape
    seen, out = np.zeros_like(a), []
    for y0, x0 in zip(*np.nonzero(a)):
        if seen[y0, x0]: continue
        stack, seen[y0, x0] = [(y0, x0)], True
        y1 = y2 = y0; x1 = x2 = x0; n = 0
        while stack:
            y, x = stack.pop(); n += 1
            y1, y2, x1, x2 = min(y1, y), max(y2, y), min(x1, x), max(x2, x)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < h and 0 <= xx < w and a[yy, xx] and not seen[yy, xx]:
                        seen[yy, xx] = True; stack.append((yy, xx))
        if 3 <= y2 - y1 + 1 <= 40 and x2 - x1 + 1 <= 2 * (y2 - y1 + 1) and n >= 3: out.append(y2 - y1 + 1)
    return sorted(out)

def test_figure_text_is_readable_at_1400px(site, crawl):
    """At 1400 px, a figure's text renders at least about 9 px high: the median glyph (mostly lower-case letters and
    digits, about 0.55 of the font size) of the image, times the scale the page shows it at, is at least 5 px."""
    import base64
    site_dir = site[0]
    small, n = [], 0
    for rel, p in crawl['pages'].items():
        for i in p['imgs']:
            src = i['src'] or ''
            if src.startswith('data:'): png = base64.b64decode(src.split(',', 1)[1])
            elif (site_dir/unquote(src)).is_file(): png = (site_dir/unquote(src)).read_bytes()
            else: continue
            g = _glyph_heights(png)
            if len(g) < 20 or not i['natural']: continue   # not a chart with text
            n += 1
            scale = min(1.0, i['shown'] / i['natural'])
            shown = g[len(g) // 2] * scale
            if shown < 5: small.append(f'{rel}: {src[:50]!r} (alt {(i["alt"] or "")[:50]!r}): shown at {scale:.2f} of its width, '
                                       f'median glyph {shown:.1f} px')
    assert n >= 5, f'only {n} figures with text found'
    assert not small, 'figures whose text is too small at 1400 px:\n' + '\n'.join(small)

def test_no_tracker_numbers_in_reader_text(crawl):
    "Pages name other pages by their title: no 'issue 13' anywhere, no 'notebook 03b' in the prose."
    bad = []
    for rel, p in crawl['pages'].items():
        bad += [f'{rel}: ...{p["text"][max(0, m.start() - 50):m.end() + 20]!r}' for m in re.finditer(r'\bissues? \d+', p['text'], re.I)]
        bad += [f'{rel}: ...{p["prose"][max(0, m.start() - 50):m.end() + 20]!r}' for m in re.finditer(r'\bnotebooks? \d+\w*\b', p['prose'], re.I)]
    assert not bad, '\n'.join(bad[:30])

def test_math_has_no_tex_left(crawl):
    bad = [f'{rel}: {t[:80]!r}' for rel, p in crawl['pages'].items() for t in p['tex']]
    assert not bad, 'formulas that show TeX commands:\n' + '\n'.join(bad)

def test_pages_show_real_outputs(crawl):
    "Getting started shows its examples' outputs, the main command's report and `--help`; the API page its list."
    gs = crawl['pages']['getting_started.html']['text']
    assert re.search(r"'h2o': \[\d+", gs), 'getting started: the method loop shows no output'
    assert 'veloxquant passkey --tokens 2000 | veloxquant generate --kv-fraction 0.125' in gs
    for want in ('KV bytes kept:', 'vs full cache', 'prefill', 'decode', 'tok/s', 'peak memory'):
        assert want in gs, f'getting started: the main command\'s report lacks {want!r}'
    assert re.search(r'usage: veloxquant generate', gs) and '--kv-fraction' in gs, 'getting started: no `veloxquant generate --help`'
    api = crawl['pages']['api.html']['text']
    import veloxquant_mlx
    assert all(f"'{n}'" in api for n in veloxquant_mlx.__all__), 'the API page does not show sorted(__all__)'

def test_explorer_usable_at_390px(site, browser):
    "On a phone the explorer's plot text stays readable and its error message is visible."
    _, base, _ = site
    ctx = browser.new_context(viewport={'width': 390, 'height': 844}, service_workers='block')
    external = set(); _block_internet(ctx, external)
    pg = ctx.new_page()
    pg.goto(base + 'explore_schedules.html', wait_until='networkidle')
    pg.wait_for_selector('.vq-widget svg', timeout=10000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.locator('.vq-widget').screenshot(path=str(SHOTS/'explore_schedules_390.png'))
    r = pg.evaluate('''() => { const w = document.querySelector('.vq-widget');
        const t = Array.from(w.querySelectorAll('svg text')).map(e => e.getBoundingClientRect().height).filter(h => h > 0);
        return {min: Math.min(...t), widest: w.scrollWidth, room: w.clientWidth}; }''')
    assert r['min'] >= 10, f'plot text is {r["min"]:.1f} px high at 390 px (its line box; about 9 px type needs 10)'
    assert r['widest'] <= r['room'] + 1, f'the explorer is {r["widest"]} px wide in {r["room"]} px'
    _set(pg, 'avg_budget', '3')
    err = pg.locator('.vq-widget .vq-error')
    assert err.is_visible() and '`avg_budget` must be an integer >= 5, got 3' in err.inner_text()
    c = pg.evaluate('''() => { const e = document.querySelector('.vq-widget .vq-error');
        const rgb = s => (s.match(/[\\d.]+/g) || []).slice(0, 4).map(Number);
        let bg = null;
        for (let n = e; n && !bg; n = n.parentElement) { const b = rgb(getComputedStyle(n).backgroundColor); if (b.length === 3 || b[3] > 0) bg = b; }
        return {fg: rgb(getComputedStyle(e).color), bg: bg || [255, 255, 255]}; }''')
    if len(c['fg']) == 4:   # a translucent colour: what shows is its blend with the background
        c['fg'] = [c['fg'][3] * f + (1 - c['fg'][3]) * b for f, b in zip(c['fg'][:3], c['bg'][:3])]
    lum = lambda c: (lambda f: 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]))(
        lambda v: (v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4)
    hi, lo = sorted([lum(c['fg']), lum(c['bg'])], reverse=True)
    assert (hi + 0.05) / (lo + 0.05) >= 4.5, f'error text contrast {(hi + 0.05) / (lo + 0.05):.1f}:1 ({c})'
    ctx.close()
    assert not external
