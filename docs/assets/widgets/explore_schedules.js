/* The schedule explorer of nbs/10_explore_schedules.ipynb, without a kernel.
 *
 * In Jupyter the notebook's ipywidgets call Python on every slider move. A static page has no Python, so this file
 * carries a JavaScript port of what that callback computes: `allocate_exact`, `pyramid_budgets` and
 * `squeeze_budgets` of veloxquant_mlx/allocators.py, in exact rational arithmetic (BigInt fractions) as the Python
 * uses `fractions.Fraction`, so the budgets are the same integers, and the notebook's `concentration_profile`.
 * tests/test_docs_site.py checks the port against the Python on random settings and the controls against the
 * notebook's widgets. The plot is redrawn as SVG on every change.
 */
(function () {
  'use strict';

  // ------------------------------------------------------------------------------------------------------------
  // exact fractions (Python's fractions.Fraction, what the allocators compute with)

  const babs = (a) => (a < 0n ? -a : a);
  function gcd(a, b) { a = babs(a); b = babs(b); while (b) { [a, b] = [b, a % b]; } return a; }

  class Frac {
    constructor(n, d = 1n) {
      if (d === 0n) throw new Error('ZeroDivisionError');
      if (d < 0n) { n = -n; d = -d; }
      const g = gcd(n, d) || 1n;
      this.n = n / g; this.d = d / g;
    }
    static of(x) {   // int, double (exact binary value, as Fraction(float)) or Frac
      if (x instanceof Frac) return x;
      if (typeof x === 'bigint') return new Frac(x, 1n);
      if (Number.isInteger(x)) return new Frac(BigInt(x), 1n);
      const view = new DataView(new ArrayBuffer(8));
      view.setFloat64(0, x);
      const hi = view.getUint32(0), lo = view.getUint32(4);
      const sign = (hi >>> 31) ? -1n : 1n, exp = (hi >>> 20) & 0x7ff;
      let mant = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo), e;
      if (exp === 0) e = -1074; else { mant |= 1n << 52n; e = exp - 1075; }
      return e >= 0 ? new Frac(sign * (mant << BigInt(e)), 1n) : new Frac(sign * mant, 1n << BigInt(-e));
    }
    add(o) { o = Frac.of(o); return new Frac(this.n * o.d + o.n * this.d, this.d * o.d); }
    sub(o) { o = Frac.of(o); return new Frac(this.n * o.d - o.n * this.d, this.d * o.d); }
    mul(o) { o = Frac.of(o); return new Frac(this.n * o.n, this.d * o.d); }
    div(o) { o = Frac.of(o); return new Frac(this.n * o.d, this.d * o.n); }
    neg() { return new Frac(-this.n, this.d); }
    cmp(o) { o = Frac.of(o); const l = this.n * o.d, r = o.n * this.d; return l < r ? -1 : l > r ? 1 : 0; }
    floor() { const q = this.n / this.d; return (this.n % this.d !== 0n && this.n < 0n) ? q - 1n : q; }  // BigInt
    isZero() { return this.n === 0n; }
    toNumber() { return Number(this.n) / Number(this.d); }
  }
  const fmax = (a, b) => (Frac.of(a).cmp(b) >= 0 ? Frac.of(a) : Frac.of(b));
  const fmin = (a, b) => (Frac.of(a).cmp(b) <= 0 ? Frac.of(a) : Frac.of(b));
  const fsum = (xs) => xs.reduce((s, x) => s.add(x), new Frac(0n));

  // ------------------------------------------------------------------------------------------------------------
  // argument checks, with the Python's messages

  class ValueError extends Error { constructor(m) { super(m); this.name = 'ValueError'; } }
  // Python's repr of a number: floats (isFloat) always show a decimal point or exponent
  function pyRepr(v, isFloat) {
    if (typeof v !== 'number') return String(v);
    if (Number.isNaN(v)) return 'nan';
    if (!Number.isFinite(v)) return v > 0 ? 'inf' : '-inf';
    if (!isFloat) return String(v);
    let s = String(v);
    if (/e/.test(s)) { s = s.replace(/e\+?/, 'e+').replace('e+-', 'e-'); if (!/\./.test(s.split('e')[0])) s = s; return s; }
    return Number.isInteger(v) ? s + '.0' : s;
  }
  function checkInt(name, value, lo, hi = null) {
    const allowed = hi === null ? `an integer >= ${lo}` : `an integer in [${lo}, ${hi}]`;
    if (typeof value !== 'number' || !Number.isInteger(value)) throw new ValueError(`\`${name}\` must be ${allowed}, got ${pyRepr(value, true)}`);
    if (value < lo || (hi !== null && value > hi)) throw new ValueError(`\`${name}\` must be ${allowed}, got ${value}`);
    return value;
  }
  function checkReal(name, value, lo = -Infinity, hi = Infinity) {
    const allowed = hi === Infinity ? 'a finite number' + (lo > -Infinity ? ` >= ${pyRepr(lo, true)}` : '')
      : `a finite number in [${pyRepr(lo, true)}, ${pyRepr(hi, true)}]`;
    if (typeof value !== 'number') throw new ValueError(`\`${name}\` must be ${allowed}, got ${value}`);
    if (!Number.isFinite(value) || !(lo <= value && value <= hi)) throw new ValueError(`\`${name}\` must be ${allowed}, got ${pyRepr(value, true)}`);
    return value;
  }
  function checkCaps(caps, nLayers, floor) {
    if (caps === null || caps === undefined) return new Array(nLayers).fill(null);
    if (caps.length !== nLayers) throw new ValueError(`caps has ${caps.length} entries: expected one per layer (${nLayers}), None for no cap`);
    return caps.map((c, i) => (c === null ? null : checkInt(`caps[${i}]`, c, floor)));
  }

  // ------------------------------------------------------------------------------------------------------------
  // the allocators (veloxquant_mlx/allocators.py)

  function scaleToTotal(weights, total, floor, caps) {
    let fixed = new Frac(BigInt(weights.length * floor)), slope = new Frac(0n);
    if (fixed.cmp(total) >= 0) return new Frac(0n);
    const kinks = [];
    weights.forEach((w, i) => {
      if (w.isZero()) return;
      kinks.push([new Frac(BigInt(floor)).div(w), new Frac(BigInt(-floor)), w]);
      if (caps[i] !== null) kinks.push([new Frac(BigInt(caps[i])).div(w), new Frac(BigInt(caps[i])), w.neg()]);
    });
    kinks.sort((a, b) => a[0].cmp(b[0]));   // stable, as Python's sorted
    for (const [s, dFixed, dSlope] of kinks) {
      if (fixed.add(slope.mul(s)).cmp(total) >= 0) return new Frac(BigInt(total)).sub(fixed).div(slope);
      fixed = fixed.add(dFixed); slope = slope.add(dSlope);
    }
    return slope.cmp(0) > 0 ? new Frac(BigInt(total)).sub(fixed).div(slope) : null;
  }

  function allocateExact(weights, total, floor, caps = null, ties = null) {
    weights = weights.map((w, i) => (w instanceof Frac ? (w.cmp(0) < 0 ? checkReal(`weights[${i}]`, w.toNumber(), 0.0) : w)
      : Frac.of(checkReal(`weights[${i}]`, w, 0.0))));
    total = checkInt('total', total, 0); floor = checkInt('floor', floor, 0);
    const n = weights.length;
    caps = checkCaps(caps, n, floor);
    ties = ties === null ? weights : ties.map((t, i) => (t instanceof Frac ? t : Frac.of(checkReal(`ties[${i}]`, t))));
    if (ties.length !== n) throw new ValueError(`ties has ${ties.length} entries: expected one per layer (${n})`);
    if (n === 0) return [];
    if (total < n * floor) throw new ValueError(`\`total\` must be an integer >= floor * len(weights) = ${n * floor}, got ${total}`);
    if (!caps.includes(null) && caps.reduce((a, b) => a + b, 0) <= total) return caps.slice();
    if (fsum(weights).isZero()) weights = new Array(n).fill(new Frac(1n));
    const s = scaleToTotal(weights, total, floor, caps);
    if (s === null) {   // positive weights all capped: the zero-weight layers share what is left evenly
      const zero = [...Array(n).keys()].filter((i) => weights[i].isZero());
      const budgets = caps.slice();
      const left = total - [...Array(n).keys()].filter((i) => !weights[i].isZero()).reduce((a, i) => a + caps[i], 0);
      const shared = allocateExact(zero.map(() => 1), left, floor, zero.map((i) => caps[i]), zero.map((i) => ties[i]));
      zero.forEach((i, k) => { budgets[i] = shared[k]; });
      return budgets;
    }
    const exact = weights.map((w, i) => fmax(new Frac(BigInt(floor)), caps[i] === null ? s.mul(w) : fmin(new Frac(BigInt(caps[i])), s.mul(w))));
    const budgets = exact.map((b) => b.floor());
    const order = [...Array(n).keys()].sort((i, j) => {
      const ri = exact[i].sub(new Frac(budgets[i])), rj = exact[j].sub(new Frac(budgets[j]));
      return rj.cmp(ri) || ties[j].cmp(ties[i]) || i - j;
    });
    let extra = BigInt(total) - budgets.reduce((a, b) => a + b, 0n);
    for (const i of order) { if (extra <= 0n) break; budgets[i] += 1n; extra -= 1n; }
    return budgets.map(Number);
  }

  function pyramidTaper(nLayers, avgBudget, floor, beta) {
    if (nLayers === 1) return [new Frac(BigInt(avgBudget))];
    const halfSpan = Frac.of(beta).sub(1).mul(avgBudget - floor);
    return [...Array(nLayers).keys()].map((l) => new Frac(BigInt(avgBudget)).add(halfSpan.mul(new Frac(1n).sub(new Frac(BigInt(2 * l), BigInt(nLayers - 1))))));
  }

  function pyramidBudgets(nLayers, avgBudget, nSink = 4, beta = 2.0, caps = null) {
    nLayers = checkInt('n_layers', nLayers, 0); nSink = checkInt('n_sink', nSink, 0);
    const floor = nSink + 1;
    avgBudget = checkInt('avg_budget', avgBudget, floor);
    beta = checkReal('beta', beta, 1.0);
    caps = checkCaps(caps, nLayers, floor);
    if (nLayers === 0) return [];
    const targets = pyramidTaper(nLayers, avgBudget, floor, beta).map((t) => fmax(t, 0));
    return allocateExact(targets, nLayers * avgBudget, floor, caps);
  }

  function squeezeTargets(concentrations, avgBudget, strength) {
    let raw = concentrations.map((c) => new Frac(1n).sub(fmin(fmax(Frac.of(c), 0), 1)));
    if (fsum(raw).isZero()) raw = raw.map(() => new Frac(1n));
    const mean = fsum(raw).div(raw.length), st = Frac.of(strength);
    return raw.map((r) => new Frac(1n).sub(st).add(st.mul(r).div(mean)).mul(avgBudget));
  }

  function squeezeBudgets(concentrations, avgBudget, nSink = 4, strength = 1.0, caps = null) {
    concentrations = concentrations.map((c, i) => checkReal(`concentrations[${i}]`, c));
    nSink = checkInt('n_sink', nSink, 0);
    const floor = nSink + 1;
    avgBudget = checkInt('avg_budget', avgBudget, floor);
    strength = checkReal('strength', strength, 0.0, 1.0);
    const n = concentrations.length;
    caps = checkCaps(caps, n, floor);
    if (n === 0) return [];
    const targets = squeezeTargets(concentrations, avgBudget, strength);
    return allocateExact(targets, n * avgBudget, floor, caps, concentrations.map((c) => Frac.of(-c)));
  }

  // ------------------------------------------------------------------------------------------------------------
  // the notebook's concentration profiles

  function linspace(start, stop, num) {   // numpy.linspace(start, stop, num): i * step + start, the last exactly stop
    if (num === 1) return [start];
    const step = (stop - start) / (num - 1);
    const y = [...Array(num).keys()].map((i) => i * step + start);
    y[num - 1] = stop;
    return y;
  }
  function randomProfile(nLayers, seed) {   // the notebook's 32-bit xorshift, 3 decimals
    let x = Number((BigInt(seed) * 2654435761n + 1n) % 4294967296n) || 1;
    const out = [];
    for (let i = 0; i < nLayers; i++) {
      x = (x ^ (x << 13)) >>> 0; x = (x ^ (x >>> 17)) >>> 0; x = (x ^ (x << 5)) >>> 0;
      out.push((x % 1000) / 1000);
    }
    return out;
  }
  function concentrationProfile(name, nLayers, seed = 0) {
    if (name === 'flat') return new Array(nLayers).fill(0.5);
    if (name === 'rising with depth') return linspace(0.1, 0.9, nLayers);
    if (name === 'random') return randomProfile(nLayers, seed);
    throw new ValueError(`name='${name}' is not a profile: expected 'flat', 'rising with depth' or 'random'`);
  }

  // ------------------------------------------------------------------------------------------------------------
  // the widget: the notebook's sliders (tests compare them with the notebook's), the notebook's two panels

  const CONTROLS = [
    { name: 'n_layers', description: 'layers', kind: 'int', min: 1, max: 64, step: 1, value: 24 },
    { name: 'avg_budget', description: 'avg budget', kind: 'int', min: 1, max: 2048, step: 1, value: 256 },
    { name: 'n_sink', description: 'sinks', kind: 'int', min: 0, max: 32, step: 1, value: 4 },
    { name: 'beta', description: 'beta', kind: 'float', min: 1.0, max: 5.0, step: 0.1, value: 2.0 },
    { name: 'strength', description: 'strength', kind: 'float', min: 0.0, max: 1.0, step: 0.05, value: 1.0 },
    { name: 'profile', description: 'profile', kind: 'select', options: ['flat', 'rising with depth', 'random'], value: 'rising with depth' },
    { name: 'seed', description: 'seed', kind: 'int', min: 0, max: 99, step: 1, value: 0 },
  ];
  const fmtG = (x) => String(Number(x.toPrecision(6)));   // Python's f"{x:g}" for these values

  function schedules(p) {
    const pyramid = pyramidBudgets(p.n_layers, p.avg_budget, p.n_sink, p.beta);
    const concentrations = concentrationProfile(p.profile, p.n_layers, p.seed);
    const squeeze = squeezeBudgets(concentrations, p.avg_budget, p.n_sink, p.strength);
    return { pyramid, squeeze, concentrations };
  }

  const SVG = 'http://www.w3.org/2000/svg';
  function el(tag, attrs = {}, parent = null, text = null) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function niceTicks(max, n = 5) {
    const raw = max / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
    const step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag, out = [];
    for (let t = 0; t <= max + 1e-9; t += step) out.push(Math.round(t * 1e6) / 1e6);
    return out;
  }

  function panel(svg, x0, y0, w, h, budgets, p, title, color, ymax, concentrations) {
    const m = { l: 52, r: concentrations ? 46 : 10, t: 24, b: 34 };
    const g = el('g', { transform: `translate(${x0},${y0})` }, svg);
    const pw = w - m.l - m.r, ph = h - m.t - m.b, n = budgets.length;
    const X = (i) => m.l + (i + 0.5) * (pw / n), Y = (v) => m.t + ph - (v / ymax) * ph, bw = Math.max(1, (pw / n) * 0.8);
    el('text', { x: m.l + pw / 2, y: 15, 'text-anchor': 'middle', class: 'vq-title' }, g, title);
    for (const t of niceTicks(ymax)) {
      el('line', { x1: m.l, x2: m.l + pw, y1: Y(t), y2: Y(t), class: 'vq-grid' }, g);
      el('text', { x: m.l - 5, y: Y(t) + 4, 'text-anchor': 'end', class: 'vq-tick' }, g, String(t));
    }
    budgets.forEach((b, i) => el('rect', { x: X(i) - bw / 2, y: Y(b), width: bw, height: Math.max(0, Y(0) - Y(b)),
      fill: color, 'fill-opacity': 0.8, 'data-budget': b }, g));
    el('line', { x1: m.l, x2: m.l + pw, y1: Y(p.avg_budget), y2: Y(p.avg_budget), stroke: 'black', 'stroke-dasharray': '5,3' }, g);
    el('line', { x1: m.l, x2: m.l + pw, y1: Y(p.n_sink + 1), y2: Y(p.n_sink + 1), stroke: 'grey', 'stroke-dasharray': '1,3' }, g);
    el('line', { x1: m.l, x2: m.l, y1: m.t, y2: m.t + ph, class: 'vq-axis' }, g);
    el('line', { x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph, class: 'vq-axis' }, g);
    const xt = niceTicks(Math.max(1, n - 1), Math.min(6, Math.max(1, n - 1)));
    for (const t of xt) if (t < n && Number.isInteger(t)) el('text', { x: X(t), y: m.t + ph + 14, 'text-anchor': 'middle', class: 'vq-tick' }, g, String(t));
    el('text', { x: m.l + pw / 2, y: h - 4, 'text-anchor': 'middle', class: 'vq-label' }, g, 'layer');
    el('text', { x: 12, y: m.t + ph / 2, 'text-anchor': 'middle', class: 'vq-label', transform: `rotate(-90 12 ${m.t + ph / 2})` }, g, 'KV budget (tokens)');
    const legend = [[`${title.split(',')[0]} (sum ${budgets.reduce((a, b) => a + b, 0)})`, color, null],
                    [`H2O uniform (${p.avg_budget})`, 'black', '5,3'], [`floor n_sink + 1 (${p.n_sink + 1})`, 'grey', '1,3']];
    legend.forEach(([label, c, dash], k) => {
      const y = m.t + 10 + k * 14, x = m.l + pw - 180;
      if (dash) el('line', { x1: x, x2: x + 16, y1: y - 4, y2: y - 4, stroke: c, 'stroke-dasharray': dash }, g);
      else el('rect', { x, y: y - 9, width: 16, height: 8, fill: c, 'fill-opacity': 0.8 }, g);
      el('text', { x: x + 20, y, class: 'vq-legend' }, g, label);
    });
    if (concentrations) {   // twin axis: the concentration profile
      const C = (c) => m.t + ph - ((c + 0.05) / 1.1) * ph;
      el('polyline', { points: concentrations.map((c, i) => `${X(i)},${C(c)}`).join(' '), fill: 'none', stroke: '#d62728', class: 'vq-conc' }, g);
      concentrations.forEach((c, i) => el('circle', { cx: X(i), cy: C(c), r: 1.8, class: 'vq-conc-dot' }, g));
      for (const t of [0, 0.2, 0.4, 0.6, 0.8, 1.0]) el('text', { x: m.l + pw + 5, y: C(t) + 4, class: 'vq-tick vq-red' }, g, String(t));
      el('text', { x: w - 10, y: m.t + ph / 2, 'text-anchor': 'middle', class: 'vq-label vq-red', transform: `rotate(90 ${w - 10} ${m.t + ph / 2})` }, g, `concentration (${p.profile})`);
    }
  }

  function draw(out, p) {
    out.textContent = '';
    let s;
    try { s = schedules(p); } catch (e) {
      const pre = document.createElement('pre'); pre.className = 'vq-error';
      pre.textContent = `${e.name || 'Error'}: ${e.message}`; out.appendChild(pre); return;
    }
    // side by side where there is room; on a phone one panel under the other, each the full width, so the text
    // keeps its size instead of shrinking with the picture
    const avail = out.clientWidth || 800, stacked = avail < 640;
    const w = stacked ? Math.max(300, avail) : avail, pw = stacked ? w : w / 2;
    const ph = stacked ? Math.round(Math.min(300, pw * 0.75)) : Math.round(Math.min(360, w * 0.36));
    const h = stacked ? 2 * ph + 12 : ph;
    const svg = el('svg', { width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: 'vq-plot', role: 'img',
      'aria-label': `PyramidKV and SqueezeAttention budgets for ${p.n_layers} layers` });
    const ymax = 1.5 * Math.max(...s.pyramid, ...s.squeeze);
    panel(svg, 0, 0, pw, ph, s.pyramid, p, `PyramidKV, beta=${fmtG(p.beta)}`, '#1f77b4', ymax, null);
    panel(svg, stacked ? 0 : pw, stacked ? ph + 12 : 0, pw, ph, s.squeeze, p, `SqueezeAttention, strength=${fmtG(p.strength)}`,
          '#ff7f0e', ymax, s.concentrations);
    out.appendChild(svg);
  }

  function mount(root) {
    root.textContent = '';
    const note = document.createElement('p'); note.className = 'vq-notice';
    note.textContent = 'Live on this page: the schedules are computed in your browser by a JavaScript port of ' +
      'pyramid_budgets and squeeze_budgets (exact, checked against the Python by the tests); in Jupyter the same ' +
      'sliders call the Python.';
    const form = document.createElement('div'); form.className = 'vq-controls';
    const out = document.createElement('div'); out.className = 'vq-output';
    const params = {};
    const redraw = () => draw(out, params);
    for (const c of CONTROLS) {
      const row = document.createElement('label'); row.className = 'vq-control';
      const name = document.createElement('span'); name.className = 'vq-control-name'; name.textContent = c.description;
      row.appendChild(name);
      let input;
      const readout = document.createElement('output');
      if (c.kind === 'select') {
        input = document.createElement('select');
        for (const o of c.options) { const opt = document.createElement('option'); opt.value = o; opt.textContent = o; input.appendChild(opt); }
        input.value = c.value;
      } else {
        input = document.createElement('input');
        Object.assign(input, { type: 'range', min: c.min, max: c.max, step: c.step });
        input.value = c.value;
      }
      input.name = c.name; input.dataset.param = c.name;
      const read = () => {
        if (c.kind === 'select') return input.value;
        const v = parseFloat(input.value);
        return c.kind === 'int' ? Math.round(v) : parseFloat(v.toFixed(10));
      };
      const update = () => {
        params[c.name] = read();
        readout.textContent = c.kind === 'float' ? params[c.name].toFixed(2) : String(params[c.name]);
      };
      update();
      input.addEventListener('input', () => { update(); redraw(); });
      row.appendChild(input);
      if (c.kind !== 'select') row.appendChild(readout);
      form.appendChild(row);
    }
    root.append(note, form, out);
    redraw();
    window.addEventListener('resize', redraw);
  }

  window.VQSchedules = { Frac, allocateExact, pyramidBudgets, squeezeBudgets, concentrationProfile, CONTROLS, schedules };
  const start = () => document.querySelectorAll('.vq-widget[data-widget="explore_schedules"]').forEach(mount);
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
