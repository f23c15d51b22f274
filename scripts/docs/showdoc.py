"""`show_doc` for the docs site: nbdev's entry (heading, [source], signature, docstring) made right for methods.

nbdev's `BasicMarkdownRenderer` names a symbol by its `__qualname__` and takes the docstring from fastcore's
`docstring`, which falls back to `__call__`'s ("Call self as a function.") when a function has none. This one:

- names a method, property or classmethod `Class.name`, whether it was written inside the class, with fastcore's
  `@patch` / `@patch(as_prop=True)` / `@patch(cls_method=True)`, or assigned later (`Class.name = name`);
- labels properties, classmethods and staticmethods, and never shows a repr (`<property object at 0x...>`);
- shows the signature (without `self`/`cls`), the symbol's own docstring (inherited from the overridden member for
  an override, nothing when there is none), and a parameter table from fastcore's `docments` (the trailing
  `# comments` of the parameters) whenever it has parameters;
- links [source] to `git_url` (settings.ini), file and line;
- lists a class's own members with links to their entries.

Installed for the docs build by `use_renderer()`, so `show_doc(...)` in a notebook (and nbdev's automatic
`show_doc` cells) render with it.
"""
from __future__ import annotations

import dataclasses, html, inspect, re, sys
from pathlib import Path

_AUTO = object()

def _is_patch_clsmethod(obj) -> bool:
    "fastcore's `@patch(cls_method=True)` stores a `_clsmethod` descriptor (not a `classmethod`) on the class."
    return type(obj).__name__ == '_clsmethod' and callable(getattr(obj, 'f', None))

def unwrap(obj):
    "The function behind a property, classmethod, staticmethod or bound method (or `obj`)."
    if isinstance(obj, property): return obj.fget or obj.fset
    if isinstance(obj, (classmethod, staticmethod)): return obj.__func__
    if _is_patch_clsmethod(obj): return obj.f
    if inspect.ismethod(obj): return obj.__func__
    return getattr(obj, '__wrapped__', None) if getattr(obj, '__wrapped__', None) and not inspect.isclass(obj) else obj

def _classes_of(mod):
    return [v for v in vars(mod).values() if inspect.isclass(v) and v.__module__ == mod.__name__] if mod else []

def owner_of(obj):
    """(class, attribute name, raw class attribute) of a method-like `obj`, or None for a free function/class.

    Works for members defined in the class body, added with fastcore's `@patch` (qualname `Class.name`), or
    assigned after the class (`Class.name = name`, qualname just `name`: found by identity among the module's classes)."""
    if inspect.isclass(obj): return None
    fn = unwrap(obj)
    if fn is None: return None
    mod = sys.modules.get(getattr(fn, '__module__', None) or '')
    qual = getattr(fn, '__qualname__', '') or ''
    if inspect.ismethod(obj) and inspect.isclass(obj.__self__):  # a classmethod reached through its class
        for c in obj.__self__.__mro__:
            for k, v in vars(c).items():
                if unwrap(v) is fn: return c, k, v
    if '.' in qual and '<locals>' not in qual:
        cls_name, _, name = qual.rpartition('.')
        cls = getattr(mod, cls_name.split('.')[0], None)
        for part in cls_name.split('.')[1:]: cls = getattr(cls, part, None)
        if inspect.isclass(cls):
            for k, v in vars(cls).items():
                if unwrap(v) is fn or v is obj: return cls, k, v
    for cls in _classes_of(mod):
        for k, v in vars(cls).items():
            if v is obj or unwrap(v) is fn: return cls, k, v
    return None

def kind_of(raw) -> str:
    if isinstance(raw, property): return 'property'
    if isinstance(raw, classmethod) or _is_patch_clsmethod(raw): return 'classmethod'
    if isinstance(raw, staticmethod): return 'staticmethod'
    return 'method'

def own_doc(obj, owner=None) -> str:
    "The symbol's own docstring, cleaned; an override without one inherits the overridden member's. Never `__call__`'s."
    if inspect.isclass(obj):
        doc = obj.__dict__.get('__doc__')
        if doc and dataclasses.is_dataclass(obj) and re.match(rf'{re.escape(obj.__name__)}\(.*\)$', doc.strip(), re.S): doc = None
        return inspect.cleandoc(doc) if doc else ''
    doc = (obj.__doc__ if isinstance(obj, property) else None) or getattr(unwrap(obj), '__doc__', None)
    if not doc and owner:
        cls, name, _ = owner
        for base in cls.__mro__[1:]:
            if name in vars(base):
                doc = getattr(unwrap(vars(base)[name]), '__doc__', None)
                if doc: break
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ''

def _anno(a) -> str:
    if a is inspect.Parameter.empty: return ''
    if isinstance(a, str): return a
    return inspect.formatannotation(a).replace('NoneType', 'None')

def _params(fn, drop_first: bool):
    try: sig = inspect.signature(fn)
    except (TypeError, ValueError): return None, None
    ps = list(sig.parameters.values())
    if drop_first and ps and ps[0].kind in (ps[0].POSITIONAL_ONLY, ps[0].POSITIONAL_OR_KEYWORD): ps = ps[1:]
    return ps, sig.return_annotation

def _fmt_param(p) -> str:
    pre = '*' if p.kind == p.VAR_POSITIONAL else '**' if p.kind == p.VAR_KEYWORD else ''
    s = pre + p.name
    if p.annotation is not p.empty: s += f':{_anno(p.annotation)}'
    if p.default is not p.empty: s += f'={_default(p.default)}'
    return s

def _default(d) -> str:
    return getattr(d, '__name__', None) or repr(d) if callable(d) else re.sub(r' at 0x[0-9a-f]+', '', repr(d))

def signature_str(prefix: str, name: str, params, ret, width: int = 100) -> str:
    "`prefix name(p, ...) -> ret`, one parameter per line when it would be wider than `width`."
    parts, kw_only_marked = [], False
    for i, p in enumerate(params):
        if p.kind == p.KEYWORD_ONLY and not kw_only_marked and not any(q.kind == q.VAR_POSITIONAL for q in params[:i]):
            parts.append('*'); kw_only_marked = True
        parts.append(_fmt_param(p))
        if p.kind == p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind != p.POSITIONAL_ONLY): parts.append('/')
    r = f' -> {_anno(ret)}' if ret is not inspect.Signature.empty and ret is not None else ''
    head = f'{prefix} {name}(' if prefix else f'{name}('
    one = head + ', '.join(parts) + ')' + r
    if len(one) <= width: return one
    return head + '\n' + ''.join(f'    {x},\n' for x in parts) + ')' + r

def _md_cell(s) -> str:
    s = '' if s is None else str(s)
    return s.replace('|', '\\|').replace('\n', ' ')

def docments_table(fn, drop_first: bool, is_class: bool = False) -> str:
    """A Markdown parameter table: types and defaults from the signature, details from fastcore's `docments` (the
    parameters' trailing comments); whenever there is a parameter (or a documented return value)."""
    from fastcore.docments import docments
    try: dm = docments(fn, full=False)
    except Exception: return ''
    params, ret = _params(fn, drop_first=drop_first and not is_class)
    if params is None: return ''
    if not params and not dm.get('return'): return ''
    rows = ['| | Type | Default | Details |', '|---|---|---|---|']
    for p in params:
        name = ('*' if p.kind == p.VAR_POSITIONAL else '**' if p.kind == p.VAR_KEYWORD else '') + p.name
        d = '' if p.default is p.empty else '<code>' + html.escape(_md_cell(_default(p.default))) + '</code>'
        rows.append(f"| <code>{html.escape(name)}</code> | {_md_cell(_anno(p.annotation))} | {d} | {_md_cell(dm.get(p.name) or '')} |")
    if dm.get('return') and not is_class:
        rows.append(f"| **Returns** | {_md_cell(_anno(ret))} | | {_md_cell(dm['return'])} |")
    return '\n'.join(rows)

class Sources:
    "[source] links: `git_url/blob/branch/<file relative to the repo>#L<line>`."
    def __init__(self, root: Path, git_url: str, branch: str):
        self.root, self.git_url, self.branch = Path(root).resolve(), (git_url or '').rstrip('/'), branch or 'main'
    def __call__(self, obj) -> str | None:
        if not self.git_url: return None
        fn = obj if inspect.isclass(obj) else unwrap(obj)
        try:
            path = Path(inspect.getsourcefile(fn)).resolve()
            line = inspect.getsourcelines(fn)[1]
            rel = path.relative_to(self.root).as_posix()
        except Exception: return None
        return f'{self.git_url}/blob/{self.branch}/{rel}#L{line}'

def anchor(name: str) -> str:
    "nbdev's anchor for a symbol: its displayed name, lower-cased (`H2OCache.trim` -> `h2ocache.trim`)."
    return name.lower()

def member_names(cls) -> list:
    "A class's own public members (methods, properties, class/static methods), in definition order."
    out, fields = [], getattr(cls, '__dataclass_fields__', {})
    for k, v in vars(cls).items():
        if k.startswith('_') and k != '__call__': continue
        if k in fields: continue   # a dataclass field (a default that is a function): the class's parameter table has it
        if isinstance(v, (property, classmethod, staticmethod)) or inspect.isfunction(v) or _is_patch_clsmethod(v): out.append((k, v))
    return out

class DocEntry:
    "One rendered entry; `_repr_markdown_` gives the Markdown that the docs page shows."
    sources: Sources | None = None   # set by `use_renderer`
    page_of = staticmethod(lambda obj: None)  # obj -> page name documenting it ('cache.html'), for member links

    def __init__(self, sym, name: str | None = None, title_level: int = 3, **kwargs):
        self.sym, self.level = sym, title_level
        self.owner = owner_of(sym)
        if self.owner:
            cls, attr, raw = self.owner
            self.kind, self.name = kind_of(raw), f'{cls.__name__}.{attr}'
        elif inspect.isclass(sym):
            self.kind = 'dataclass' if dataclasses.is_dataclass(sym) else 'class'
            self.name = sym.__qualname__
        elif callable(sym):
            self.kind, self.name = 'function', getattr(unwrap(sym), '__qualname__', None) or getattr(sym, '__name__', repr(sym))
        else:
            self.kind, self.name = 'constant', name or '?'
        if name and not self.owner: self.name = name
        self.id = anchor(self.name)

    @property
    def key(self):
        "Identity of what is documented (one entry per symbol and page)."
        return self.sym if inspect.isclass(self.sym) else (unwrap(self.sym) or self.sym)

    def signature(self) -> str:
        sym, kind = self.sym, self.kind
        if kind == 'property':
            ret = inspect.signature(unwrap(sym)).return_annotation if unwrap(sym) else inspect.Signature.empty
            settable = isinstance(self.owner[2], property) and self.owner[2].fset is not None
            return f'{self.name}' + (f': {_anno(ret)}' if ret is not inspect.Signature.empty else '') + ('  # settable' if settable else '')
        if kind == 'constant': return f'{self.name} = {_short_repr(sym)}'
        if kind in ('class', 'dataclass'):
            params, _ = _params(sym, False)
            return signature_str('class', self.name, params or [], inspect.Signature.empty)
        fn = unwrap(sym)
        params, ret = _params(fn, drop_first=kind in ('method', 'classmethod'))
        if params is None: return f'{self.name}(...)'
        prefix = 'async' if inspect.iscoroutinefunction(fn) else ''
        return signature_str(prefix, self.name, params, ret)

    def members_md(self) -> str:
        if self.kind not in ('class', 'dataclass'): return ''
        items = []
        for k, v in member_names(self.sym):
            page = DocEntry.page_of(v) or ''
            label = '' if inspect.isfunction(v) else kind_of(v)
            href = html.escape(f'{page}#{anchor(self.sym.__name__ + "." + k)}')
            items.append(f'<a href="{href}"><code>{html.escape(k)}</code></a>' + (f' <small>({label})</small>' if label else ''))
        return ('**Members:** ' + ' · '.join(items)) if items else ''

    def _repr_markdown_(self) -> str:
        src = DocEntry.sources(self.sym) if DocEntry.sources else None
        h = f'h{self.level}'
        badge = '' if self.kind in ('function', 'method', 'class') else f' <span class="vq-kind">{self.kind}</span>'
        link = f' <a class="vq-source" href="{html.escape(src)}" target="_blank" rel="noopener">[source]</a>' if src else ''
        out = [f'<{h} class="vq-doc" id="{html.escape(self.id)}"><code>{html.escape(self.name)}</code>{badge}{link}</{h}>', '']
        sig = self.signature()
        if sig != self.name: out += [f'```python\n{sig}\n```', '']   # a property without annotation: the heading says it all
        doc = own_doc(self.sym, self.owner) if self.kind != 'constant' else ''
        if doc: out += [doc, '']
        if self.kind not in ('property', 'constant'):
            fn = self.sym if self.kind in ('class', 'dataclass') else unwrap(self.sym)
            tbl = docments_table(fn, drop_first=self.kind in ('method', 'classmethod', 'class', 'dataclass'),
                                 is_class=self.kind in ('class', 'dataclass'))
            if tbl: out += [tbl, '']
        mem = self.members_md()
        if mem: out += [mem, '']
        return '\n'.join(out).strip() + '\n'

    def __repr__(self): return f'DocEntry({self.name})'

def _short_repr(o, n=200):
    r = repr(o)
    r = re.sub(r' at 0x[0-9a-f]+', '', r)
    return r if len(r) <= n else r[:n] + ' ...'

def use_renderer(sources: Sources | None, page_of=None):
    "Make nbdev's `show_doc` render with `DocEntry` in this process (nbdev looks its default renderer up at call time)."
    import nbdev.showdoc as sd
    DocEntry.sources = sources
    if page_of: DocEntry.page_of = staticmethod(page_of)
    sd.BasicMarkdownRenderer = DocEntry
    return DocEntry
