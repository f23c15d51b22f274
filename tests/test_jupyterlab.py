"""The schedule explorer as people run it: JupyterLab, Run All in a fresh kernel, move a slider, the plot follows.

Starts `jupyter lab` on a localhost port it chooses itself (`--port=0`, read back from its runtime file; a start
that fails is retried) with a token, in a temporary folder holding a copy of
nbs/10_explore_schedules.ipynb (so nothing in the checkout is written), opens it in headless Chromium, runs all
cells, moves the `beta` slider with the keyboard as a user would, and checks that the figure (the PNG in the widget's
output) changes and that no cell shows an error or writes to stderr. About half a minute on 2 cores.
"""
import json, os, re, secrets, shutil, subprocess, sys, time, urllib.error, urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get('CHROMIUM') or shutil.which('chromium') or '/usr/bin/chromium'
ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync']
NB = '10_explore_schedules.ipynb'

NO_BROWSER = 'the schedule explorer is not run in JupyterLab in a browser (Run All, a slider moved, the plot redrawn)'
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (Path(sys.executable).parent/'jupyter-lab').exists(),
                                 reason=f'needs jupyterlab (a dev requirement: pip install -e ".[dev]"): {NO_BROWSER}')]
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason=f'needs Chromium from the OS at {CHROMIUM} (apt-get install chromium, or '
                                           f'CHROMIUM=/path): {NO_BROWSER}')
START_TRIES = 3     # a start that fails (its port taken between jupyter choosing and binding it) is retried

def _start_lab(work, state, attempt):
    """`jupyter lab` on a port it picks (`--port=0`, no port retries): (process, base url, token, log path) once it
    answers, None if it exited (its port taken between picking and binding it)."""
    runtime, token = state/f'runtime{attempt}', secrets.token_hex(16)
    env = {**os.environ, 'JUPYTER_CONFIG_DIR': str(state/'config'), 'JUPYTER_RUNTIME_DIR': str(runtime),
           'IPYTHONDIR': str(state/'ipython'), 'JUPYTERLAB_WORKSPACES_DIR': str(state/'workspaces'), 'MPLBACKEND': 'Agg'}
    env.pop('JUPYTER_PORT', None)
    cmd = [str(Path(sys.executable).parent/'jupyter-lab'), '--no-browser', '--ip=127.0.0.1', '--port=0',
           '--ServerApp.port_retries=0', f'--IdentityProvider.token={token}', f'--ServerApp.root_dir={work}',
           '--LabApp.expose_app_in_browser=True',
           '--LabApp.news_url=', '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate',
           f'--LabApp.user_settings_dir={state/"settings"}', f'--LabApp.workspaces_dir={state/"workspaces"}']
    if hasattr(os, 'geteuid') and os.geteuid() == 0: cmd.append('--allow-root')   # CI containers run as root
    log_path = state/f'lab{attempt}.log'
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300            # generous, and only a bound on waiting for the event
    base = None
    while time.monotonic() < deadline and proc.poll() is None:
        if base is None:     # the server writes the port it listens on to its runtime file once it listens
            info = sorted(runtime.glob('jpserver-*.json'))
            try: base = f"http://127.0.0.1:{json.loads(info[0].read_text())['port']}" if info else None
            except (ValueError, KeyError): base = None   # written but not yet complete
        if base is not None:
            try:
                with urllib.request.urlopen(f'{base}/api/status?token={token}', timeout=10) as r:
                    if r.status == 200: return proc, base, token, log_path
            except Exception: pass
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill(); proc.wait()
        pytest.fail('jupyter lab did not answer:\n' + log_path.read_text()[-3000:])
    return None                                  # it exited: the caller starts another

@pytest.fixture
def lab(tmp_path):
    work, state = tmp_path/'work', tmp_path/'state'
    work.mkdir(); state.mkdir()
    shutil.copy(ROOT/'nbs'/NB, work/NB)
    for attempt in range(START_TRIES):
        started = _start_lab(work, state, attempt)
        if started: break
    else: pytest.fail(f'jupyter lab exited on each of {START_TRIES} starts:\n'
                      + (state/f'lab{attempt}.log').read_text()[-3000:])
    proc, base, token, _ = started
    try: yield base, token, work
    finally:
        proc.terminate()
        try: proc.wait(timeout=20)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()

def test_lab_serves_the_explorer_notebook(lab):
    "No browser: the server started on the port it chose answers with the token and lists the copied notebook."
    base, token, work = lab
    with urllib.request.urlopen(f'{base}/api/contents/{NB}?token={token}&content=0', timeout=60) as r:
        assert r.status == 200 and json.load(r)['name'] == NB
    try: urllib.request.urlopen(f'{base}/api/contents/{NB}?content=0', timeout=60)
    except urllib.error.HTTPError as e: assert e.code == 403, e   # without the token: refused
    else: raise AssertionError('the lab answered without its token')

@needs_chromium
def test_run_all_then_a_slider_redraws_the_plot(lab):
    pw = pytest.importorskip('playwright.sync_api',
                             reason=f'needs playwright (a dev requirement: pip install -e ".[dev]"): {NO_BROWSER}')
    base, token, work = lab
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = browser.new_context(viewport={'width': 1400, 'height': 1000})
        ctx.route('**/*', lambda r: r.continue_() if r.request.url.startswith(('http://127.0.0.1', 'ws://127.0.0.1', 'data:', 'blob:'))
                  else r.abort())
        page = ctx.new_page()
        page.goto(f'{base}/lab/tree/{NB}?token={token}', wait_until='domcontentloaded')
        page.wait_for_function('() => window.jupyterapp && document.querySelector(".jp-NotebookPanel .jp-Cell")', timeout=120000)
        # a fresh kernel: wait until it is idle, then Run All
        page.wait_for_function('''() => { const p = window.jupyterapp.shell.currentWidget;
            return p && p.sessionContext && p.sessionContext.session && p.sessionContext.session.kernel &&
                   p.sessionContext.session.kernel.status === 'idle'; }''', timeout=120000)
        page.evaluate('() => window.jupyterapp.commands.execute("notebook:run-all-cells")')
        n_code = page.evaluate('() => document.querySelectorAll(".jp-NotebookPanel .jp-CodeCell").length')
        page.wait_for_function('''(n) => { const prompts = Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt'))
                                              .map(e => e.textContent.trim());
            const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            return prompts.length === n && prompts.every(t => /^\\[\\d+\\]:$/.test(t)) && k.status === 'idle'; }''',
                               arg=n_code, timeout=240000)
        img = page.locator('.widget-interact .widget-output img')
        img.first.wait_for(timeout=60000)
        before = img.first.get_attribute('src')
        assert before and before.startswith('data:image/png'), 'the explorer shows no plot after Run All'
        # the beta slider: its handle, moved with the keyboard as a user would
        slider = page.locator('.widget-interact .widget-slider', has=page.locator('.widget-label', has_text=re.compile(r'^beta$')))
        assert slider.count() == 1, 'no beta slider in the explorer'
        readout = slider.locator('.widget-readout').inner_text()
        handle = slider.locator('.noUi-handle')
        handle.focus(); handle.press('ArrowRight'); handle.press('ArrowRight')
        page.wait_for_function('''(b) => { const i = document.querySelector('.widget-interact .widget-output img');
                                           return i && i.getAttribute('src') !== b; }''', arg=before, timeout=60000)
        page.wait_for_function('() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === "idle"', timeout=60000)
        page.wait_for_timeout(500)
        after = img.first.get_attribute('src')
        assert after != before and after.startswith('data:image/png'), 'moving the beta slider did not redraw the plot'
        assert slider.locator('.widget-readout').inner_text() != readout
        # no error anywhere: no error output, nothing on stderr, no traceback text
        errors = page.evaluate('''() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))
            .filter(o => o.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr' || /Traceback|Error:/.test(o.innerText))
            .map(o => o.innerText.slice(0, 300))''')
        assert not errors, f'errors in the notebook: {errors}'
        browser.close()
    assert (work/'images'/'schedules_pyramid.png').exists(), 'Run All did not reach the last cell'
