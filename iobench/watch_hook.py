"""The environment hook behind ``iobench measure -- python train.py``: no change to the script.

``iobench measure`` runs the command with a ``sitecustomize`` on ``PYTHONPATH`` that calls
``install()`` in every Python process the command starts.  ``install`` puts an import hook on
``torch.utils.data.dataloader`` (or patches it at once where torch is loaded already): from then
on, iterating any ``DataLoader`` goes through an ``iobench.watch`` of that loader — one ``Watch``
per DataLoader, kept across its epochs, whose results go to
``$IOBENCH_MEASURE_DIR/loader-PID-N.json`` (N: the order in which that process first iterated them).

Where it is reliable, and where not:
- torch ``DataLoader`` iterated with ``for``/``iter``/``next`` (plain PyTorch, most trainers): yes.
- Code that uses the DataLoader's iterator object itself (``_MultiProcessingDataLoaderIter``
  attributes, ``_reset``): it gets a generator instead and may fail; use ``iobench.watch`` in code.
- Other loaders (tf.data, a generator, a nanoGPT ``get_batch`` loop): not hooked; nothing is
  recorded (``measure`` says so) — wrap them in ``iobench.watch`` in the script.
- A DataLoader iterated in a child process (the hook is installed there too, and writes its own file).
- A process that ends with ``os._exit`` or a signal: an epoch in progress is not written.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import os
import sys
import weakref

_TARGET = "torch.utils.data.dataloader"
_counter = itertools.count()
_watches: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Unpatched:
    """The DataLoader as its own ``__iter__`` sees it (the Watch must not iterate the patched one)."""

    def __init__(self, loader, orig_iter) -> None:
        self.loader, self.orig_iter = loader, orig_iter

    def __iter__(self):
        return self.orig_iter(self.loader)


def patch(DataLoader) -> None:
    """Route ``DataLoader.__iter__`` through one ``iobench.watch`` per loader."""
    if getattr(DataLoader.__iter__, "_iobench_watch", False):
        return
    orig_iter = DataLoader.__iter__
    out_dir = os.environ.get("IOBENCH_MEASURE_DIR") or "."
    data_path = os.environ.get("IOBENCH_MEASURE_PATH") or None

    def __iter__(self):
        from .watch import Watch, loader_settings

        w = _watches.get(self)
        if w is None:
            n = next(_counter)
            w = Watch(_Unpatched(self, orig_iter), json=os.path.join(out_dir, f"loader-{os.getpid()}-{n}.json"),
                      path=data_path, name=f"DataLoader #{n} in pid {os.getpid()}")
            w.settings = loader_settings(self)   # the real DataLoader's num_workers / prefetch_factor
            _watches[self] = w
        return iter(w)

    __iter__._iobench_watch = True  # type: ignore[attr-defined]
    DataLoader.__iter__ = __iter__


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``torch.utils.data.dataloader`` as usual, and patches its DataLoader once it has run."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)   # one patch per process; and find_spec below must not find us
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        class _Patching(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                run(module)
                patch(module.DataLoader)

        spec.loader = _Patching()
        return spec


def install() -> None:
    """Watch every torch DataLoader this process iterates (see the module docstring)."""
    mod = sys.modules.get(_TARGET)
    if mod is not None:
        patch(mod.DataLoader)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


# The sitecustomize ``iobench measure`` writes: it finds iobench (and its dependencies, after the
# command's own), installs the hook, then hands on to any sitecustomize the command had.
# site.addsitedir, not a bare append: it runs the directories' .pth files too, and an editable
# install maps iobench.formats / .checkpointing / .gds (pyproject package-dir) only through its .pth
# finder -- without it another interpreter (the user's training venv) found iobench but not its formats.
SITECUSTOMIZE = '''\
import os as _os, site as _site, sys as _sys
for _p in _os.environ.get("IOBENCH_MEASURE_SYSPATH", "").split(_os.pathsep):
    if _p and _p not in _sys.path:
        _site.addsitedir(_p)
try:
    from iobench.watch_hook import install as _install
    _install()
except Exception as _e:  # the command must run even where the hook cannot
    _sys.stderr.write(f"iobench measure: not watching this process ({type(_e).__name__}: {_e})\\n")
_here = _os.path.dirname(_os.path.abspath(__file__))
_rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
import importlib.machinery as _m
_spec = _m.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:   # the command's own sitecustomize runs too
    import importlib.util as _u
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
'''
