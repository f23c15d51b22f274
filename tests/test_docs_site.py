"""The docs site, built offline from the notebooks and read in a real browser (Debian's headless Chromium).

Builds the site with `scripts/build_docs.py` into a temporary folder, serves it on 127.0.0.1, visits
every page and fails on: a console error or uncaught exception, a same-origin request that fails or
answers non-2xx, an image that does not load, any request to a host other than localhost, an internal
link (or #anchor) that leads nowhere, search that finds nothing, embedded widgets that do not render.
Screenshots of the home page and of the schedule explorer go to `_docs/screenshots/`.
"""
import functools, http.server, json, os, re, shutil, subprocess, sys, threading, time, urllib.error, urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urlsplit, unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get('CHROMIUM') or shutil.which('chromium') or '/usr/bin/chromium'
SHOTS = ROOT/'_docs'/'screenshots'
LOCAL_HOSTS = {'127.0.0.1', 'localhost'}
CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--disable-background-networking',
                 '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-default-apps']

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f'no Chromium at {CHROMIUM}: `apt-get install chromium` (.ci/run installs it)')

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "Build the site once; serve it on a free localhost port."
    out = tmp_path_factory.mktemp('docs')
    t0 = time.time()
    r = subprocess.run([sys.executable, str(ROOT/'scripts'/'build_docs.py'), '--out', str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f'docs build failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}'
    print(f'docs build: {time.time() - t0:.1f}s')
    site_dir = out/'site'
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_Quiet, directory=str(site_dir)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield site_dir, f'http://127.0.0.1:{httpd.server_address[1]}/', r.stderr
    httpd.shutdown(); httpd.server_close()

def pages_of(site_dir):
    return sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob('*.html'))

def test_site_has_every_notebook_and_api_page(site):
    site_dir, _, log = site
    sys.path.insert(0, str(ROOT/'scripts'))
    import build_docs
    nbs = build_docs.find_notebooks(ROOT/'nbs')
    want = [build_docs.page_path(Path(p.relative_to(ROOT/'nbs').as_posix())).with_suffix('.html').as_posix() for p in nbs]
    have = set(pages_of(site_dir))
    assert set(want) <= have, f'notebook pages missing: {sorted(set(want) - have)}'
    assert 'reference/index.html' in have
    nav = (site_dir/'index.html').read_text()
    for w in want: assert f'href="{w}"' in nav or (w == 'index.html'), f'{w} not in the sidebar'
    # sidebar order is notebook order
    pos = [nav.find(f'href="{w}"') for w in want[1:]]
    assert pos == sorted(pos), 'sidebar is not in notebook order'

def test_no_internet_assets_in_files(site):
    site_dir, _, _ = site
    bad = []
    for f in site_dir.rglob('*'):
        if f.suffix not in ('.html', '.css'): continue
        text = f.read_text(errors='replace')
        bad += [f'{f.name}: {m}' for m in re.findall(r'(?:src=|@import\s+|url\()\s*["\']?(?:https?:)?//[^"\')\s]+', text)]
        bad += [f'{f.name}: {m}' for m in re.findall(r'<link\b[^>]*rel="(?:stylesheet|preload|preconnect|icon)"[^>]*href="(?:https?:)?//[^"]+"', text)]
    assert not bad, 'assets from the internet:\n' + '\n'.join(bad[:20])

def test_every_page_in_chromium(site):
    pw = pytest.importorskip('playwright.sync_api', reason='playwright is a dev requirement: pip install -e ".[dev]"')
    site_dir, base, _ = site
    pages = pages_of(site_dir)
    problems, external, ids, links = [], set(), {}, {}
    current = {'page': None}

    def note(kind, msg): problems.append(f'[{current["page"]}] {kind}: {msg}')

    def route(r):
        host = urlsplit(r.request.url).hostname
        if urlsplit(r.request.url).scheme in ('data', 'blob') or host in LOCAL_HOSTS: return r.continue_()
        external.add(r.request.url); r.abort()

    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={'width': 1280, 'height': 900}, service_workers='block')
        ctx.route('**/*', route)
        page = ctx.new_page()
        page.on('console', lambda m: m.type == 'error' and note('console error', m.text))
        page.on('pageerror', lambda e: note('uncaught exception', str(e)))
        page.on('requestfailed', lambda r: urlsplit(r.url).hostname in LOCAL_HOSTS and
                note('request failed', f'{r.url} {r.failure}'))
        page.on('response', lambda r: urlsplit(r.url).hostname in LOCAL_HOSTS and not (200 <= r.status < 400) and
                note(f'HTTP {r.status}', r.url))
        for rel in pages:
            current['page'] = rel
            page.goto(base + rel, wait_until='load')
            page.wait_for_load_state('networkidle')
            n_views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
            if n_views:
                try: page.wait_for_function(
                    f'document.querySelectorAll(".widget-subarea, .jupyter-widgets-view").length >= {n_views}', timeout=20000)
                except pw.TimeoutError: note('widgets', f'{n_views} widget views, not all rendered')
            broken = page.evaluate('''() => Array.from(document.images)
                .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.currentSrc || i.src)''')
            for b in broken: note('image not shown', b)
            ids[rel] = set(page.evaluate('''() => Array.from(document.querySelectorAll('[id], a[name]'))
                .map(e => e.id || e.getAttribute('name'))'''))
            for href in page.evaluate('() => Array.from(document.querySelectorAll("a[href]")).map(a => a.href)'):
                if urlsplit(href).hostname in LOCAL_HOSTS: links.setdefault(href, set()).add(rel)
            if rel == 'index.html':
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS/'home.png'), full_page=True)
            if 'explore' in rel and not rel.startswith('reference/'):
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS/f'{Path(rel).stem}.png'), full_page=True)

        # search: Material's offline lunr index finds a notebook page by a word of its title
        current['page'] = 'search'
        titles = {d['location']: d['title'] for d in json.loads((site_dir/'search/search_index.json').read_text())['docs']}
        target = next((loc for loc in titles if loc.endswith('.html') and loc not in ('index.html', '') and '#' not in loc), None)
        if target:
            word = max(re.findall(r'[A-Za-z]{4,}', titles[target]) or ['veloxquant'], key=len)
            page.goto(base + 'index.html', wait_until='networkidle')
            box = page.locator('input.md-search__input')
            box.click(); box.press_sequentially(word, delay=20)  # Material searches on key events
            try: page.wait_for_selector('.md-search-result__item', timeout=15000)
            except pw.TimeoutError: note('search', f'no result for {word!r}')
        browser.close()

    # internal links: the target answers 2xx, and its #anchor exists on the page
    for href, where in sorted(links.items()):
        url, frag = urldefrag(href)
        path = unquote(urlsplit(url).path).lstrip('/') or 'index.html'
        if path.endswith('/'): path += 'index.html'
        if path in ids:
            if frag and unquote(frag) not in ids[path]:
                problems.append(f'[{sorted(where)[0]}] broken anchor: {href}')
            continue
        try:
            with urllib.request.urlopen(url, timeout=10) as r: ok = 200 <= r.status < 300
        except urllib.error.HTTPError: ok = False
        if not ok: problems.append(f'[{sorted(where)[0]}] broken link: {href}')

    assert not external, 'requests to the internet:\n' + '\n'.join(sorted(external))
    assert not problems, f'{len(problems)} problems on {len(pages)} pages:\n' + '\n'.join(problems[:50])
    assert (SHOTS/'home.png').exists()
